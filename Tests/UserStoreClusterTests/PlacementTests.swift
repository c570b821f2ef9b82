import ClusterTestSupport
import Foundation
import Testing
import UserStoreCluster
import UserStoreCore

/// Bucket placement: the bucket function as the issue defines it, checked against Python's
/// hashlib (an independent implementation), and rendezvous hashing's stability.
struct PlacementTests {
    @Test func theBucketIsTheFirstEightBytesOfSHA256ModuloTheBucketCount() throws {
        let users = ["alice", "bob", "u-1", "user.name_42", "0123456789abcdef0123456789abcdef"]
        let script = "import hashlib,sys\nfor u in sys.argv[1:]: print(int.from_bytes(hashlib.sha256(u.encode()).digest()[:8], 'big') % 4096)"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script] + users
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let expected = output.split(separator: "\n").map { Int($0)! }
        #expect(expected.count == users.count)
        #expect(try users.map { Placement.bucket(for: try UserID($0)) } == expected)
    }

    @Test func bucketsSpreadEvenly() throws {
        var counts = [Int](repeating: 0, count: Placement.bucketCount)
        for index in 0..<409_600 { counts[Placement.bucket(for: try UserID("user-\(index)"))] += 1 }
        // 100 per bucket on average; a binomial spread keeps every bucket well within 50–150.
        #expect(counts.min()! > 50 && counts.max()! < 150, "\(counts.min()!)…\(counts.max()!)")
    }

    @Test func rendezvousMovesOnlyTheBucketsOfAHostThatLeaves() {
        let hosts = ["host-a", "host-b", "host-c"]
        let before = (0..<Placement.bucketCount).map { Placement.rendezvousOwner(of: $0, among: hosts)! }
        let after = (0..<Placement.bucketCount).map { Placement.rendezvousOwner(of: $0, among: ["host-a", "host-c"])! }
        for bucket in 0..<Placement.bucketCount where before[bucket] != "host-b" {
            #expect(after[bucket] == before[bucket])
        }
        let share = before.filter { $0 == "host-b" }.count
        #expect(share > 1200 && share < 1530, "host-b had \(share) of 4096")
        #expect(Placement.rendezvousOwner(of: 7, among: [String]()) == nil)
        // The order hosts are listed in does not matter.
        #expect(Placement.rendezvousOwner(of: 7, among: hosts) == Placement.rendezvousOwner(of: 7, among: hosts.reversed()))
    }
}
