import ClusterTestSupport
import Foundation
import Testing
@testable import UserStoreCluster

/// EtcdClient against real etcd members: the primitives placement is built on (create-if-
/// absent, compare-and-swap epochs, leases), and a member's death.
@Suite(.serialized) struct EtcdClientTests {
    @Test func keysAreWrittenReadListedAndDeleted() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let revision = try await etcd.put("/us/v1/hosts/a", "{\"address\":\"127.0.0.2\"}")
        try await etcd.put("/us/v1/hosts/b", "b")
        try await etcd.put("/us/v1/hostsX", "not under the prefix")
        let a = try #require(try await etcd.get("/us/v1/hosts/a"))
        #expect(a.text == "{\"address\":\"127.0.0.2\"}" && a.modRevision == revision && a.version == 1)
        #expect(try await etcd.list(prefix: "/us/v1/hosts/").map(\.key) == ["/us/v1/hosts/a", "/us/v1/hosts/b"])
        #expect(try await etcd.delete("/us/v1/hosts/a"))
        #expect(try await etcd.get("/us/v1/hosts/a") == nil)
        #expect(try await !etcd.delete("/us/v1/hosts/a"))
    }

    @Test func onlyOneOfManyCreatorsWinsAndEveryoneSeesTheWinner() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let results = try await withThrowingTaskGroup(of: (String, Bool, String).self) { group in
            for host in (0..<8).map({ "host-\($0)" }) {
                group.addTask {
                    let result = try await etcd.create("/us/v1/controller", host)
                    return (host, result.created, result.current.text)
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let winners = results.filter(\.1)
        #expect(winners.count == 1)
        #expect(results.allSatisfy { $0.2 == winners.first?.0 })
    }

    @Test func aSwapSucceedsOnlyAgainstTheRevisionItSawAndReturnsTheNewEpoch() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let first = try #require(try await etcd.swap("/us/v1/buckets/7", expectedModRevision: 0, to: "{\"owner\":\"a\"}"))
        #expect(try await etcd.swap("/us/v1/buckets/7", expectedModRevision: 0, to: "{\"owner\":\"b\"}") == nil)
        let second = try #require(try await etcd.swap("/us/v1/buckets/7", expectedModRevision: first, to: "{\"owner\":\"b\"}"))
        #expect(second > first)
        // The stale owner's swap (it still believes epoch `first`) loses.
        #expect(try await etcd.swap("/us/v1/buckets/7", expectedModRevision: first, to: "{\"owner\":\"a\"}") == nil)
        let record = try #require(try await etcd.get("/us/v1/buckets/7"))
        #expect(record.text == "{\"owner\":\"b\"}" && record.modRevision == second)
    }

    @Test func aKeyBoundToALeaseLivesWhileItIsKeptAliveAndGoesWithIt() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let kept = try await etcd.grantLease(ttlSeconds: 2)
        let dropped = try await etcd.grantLease(ttlSeconds: 2)
        #expect(kept.ttlSeconds == 2 && kept.id != dropped.id)
        try await etcd.put("/us/v1/hosts/kept", "k", lease: kept.id)
        try await etcd.put("/us/v1/hosts/dropped", "d", lease: dropped.id)
        #expect(try await etcd.get("/us/v1/hosts/kept")?.lease == kept.id)
        // Keep one alive until the other's key is gone (etcd expires leases at its own pace).
        let deadline = ContinuousClock.now + .seconds(20)
        while try await etcd.get("/us/v1/hosts/dropped") != nil, ContinuousClock.now < deadline {
            #expect(try await etcd.keepAlive(kept.id) == 2)
            try await Task.sleep(for: .milliseconds(200)) // the keepalive period, not a wait for an event
        }
        #expect(try await etcd.get("/us/v1/hosts/dropped") == nil)
        #expect(try await etcd.get("/us/v1/hosts/kept") != nil)
        #expect(try await etcd.keepAlive(dropped.id) == 0)
        try await etcd.revokeLease(kept.id)
        #expect(try await etcd.get("/us/v1/hosts/kept") == nil)
        try await etcd.revokeLease(kept.id) // already gone: not an error
    }

    @Test func callsGoOnThroughTheOtherMembersWhenTheLeaderIsKilled() async throws {
        let cluster = try EtcdCluster(size: 3)
        let leader = try #require(cluster.leader())
        // The dead leader first in the list: the client must move past it.
        let order = [leader] + (0..<3).filter { $0 != leader }
        let etcd = EtcdClient(endpoints: order.map { cluster.endpoints[$0] }, requestTimeout: .seconds(2))
        try await etcd.put("/us/v1/before", "1")
        cluster.kill(leader)
        let killed = ContinuousClock.now
        var written: Int64?
        while written == nil, ContinuousClock.now - killed < .seconds(30) {
            do {
                written = try await etcd.put("/us/v1/after", "2")
            } catch {
                // No leader yet (the two survivors elect one): only that may fail.
                switch error {
                case .ambiguous, .unavailable: continue
                default: throw error
                }
            }
        }
        #expect(written != nil)
        print("etcd: a put succeeded \(ContinuousClock.now - killed) after the leader's SIGKILL")
        #expect(try await etcd.get("/us/v1/before")?.text == "1")
        #expect(try await etcd.get("/us/v1/after")?.text == "2")
    }

    @Test func noMemberReachableIsUnavailableAndAnErrorReplyIsNamed() async throws {
        let ports = try EtcdCluster.freePorts(2)
        let nowhere = EtcdClient(endpoints: ports.map { "http://127.0.0.1:\($0)" })
        await #expect(throws: EtcdError.self) { try await nowhere.put("/k", "v") }
        do {
            try await nowhere.put("/k", "v")
        } catch {
            guard case .unavailable = error else { Issue.record("expected unavailable, got \(error)"); return }
        }
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        do {
            try await etcd.put("/k", "v", lease: 12345)
            Issue.record("a put with an unknown lease succeeded")
        } catch {
            guard case .server(_, let message) = error else { Issue.record("expected a server error, got \(error)"); return }
            #expect(message.contains("lease not found"))
        }
    }

    @Test func aPrefixRangeEndsJustAfterThePrefix() {
        #expect(EtcdClient.rangeEnd(of: "/us/v1/hosts/") == "/us/v1/hosts0")
    }

    /// The gateway writes 64-bit integers as strings; numbers are taken too, anything else refused.
    @Test func gatewayIntegersDecodeFromStringsAndNumbers() throws {
        let decoder = JSONDecoder()
        #expect(try decoder.decode(EtcdWire.Header.self, from: Data(#"{"revision":"42"}"#.utf8)).revision?.value == 42)
        #expect(try decoder.decode(EtcdWire.Header.self, from: Data(#"{"revision":7}"#.utf8)).revision?.value == 7)
        #expect(try decoder.decode(EtcdWire.Header.self, from: Data("{}".utf8)).revision == nil)
        #expect(throws: DecodingError.self) { try decoder.decode(EtcdWire.Header.self, from: Data(#"{"revision":"x"}"#.utf8)) }
        #expect(String(decoding: try JSONEncoder().encode(EtcdWire.LeaseID(ID: .init(5))), as: UTF8.self) == #"{"ID":"5"}"#)
    }
}
