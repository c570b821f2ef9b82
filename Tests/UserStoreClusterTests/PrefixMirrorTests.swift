import ClusterTestSupport
import Foundation
import Testing
@testable import UserStoreCluster

/// PrefixMirror against real etcd: it follows puts and deletes through a watch, and keeps
/// following after the member it watched through is killed.
@Suite(.serialized) struct PrefixMirrorTests {
    /// Waits (polling the mirror, up to 20 s) until `condition` holds.
    static func eventually(_ condition: () -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(20)
        while !condition() {
            if ContinuousClock.now > deadline { return false }
            try await Task.sleep(for: .milliseconds(20)) // polling the mirror, which has no notification
        }
        return true
    }

    @Test func theMirrorFollowsPutsAndDeletesAndSurvivesTheLossOfItsMember() async throws {
        let cluster = try EtcdCluster(size: 3)
        let etcd = EtcdClient(endpoints: cluster.endpoints, requestTimeout: .seconds(2))
        try await etcd.put("/us/v1/hosts/a", "1")
        try await etcd.put("/us/v1/other", "not mirrored")
        let mirror = PrefixMirror(etcd: etcd, prefix: "/us/v1/hosts/") { $0.text == "bad" ? nil : $0.text }
        let following = Task { await mirror.run(retry: .milliseconds(100)) }
        #expect(try await Self.eventually { mirror["a"]?.value == "1" })
        try await etcd.put("/us/v1/hosts/b", "2")
        try await etcd.put("/us/v1/hosts/a", "3")
        try await etcd.delete("/us/v1/hosts/b")
        try await etcd.put("/us/v1/hosts/c", "4")
        try await etcd.put("/us/v1/hosts/e", "bad") // does not decode: left out
        #expect(try await Self.eventually { mirror.all.mapValues(\.value) == ["a": "3", "c": "4"] })
        #expect(mirror["other"] == nil)

        // Kill the member the mirror watches through (the client's preferred one).
        let watched = cluster.endpoints.firstIndex(of: etcd.endpoints[0])!
        cluster.kill(watched)
        var written = false
        while !written {
            do { try await etcd.put("/us/v1/hosts/d", "5"); written = true } catch { continue } // until a leader answers
        }
        try await etcd.delete("/us/v1/hosts/a")
        #expect(try await Self.eventually { mirror.all.mapValues(\.value) == ["c": "4", "d": "5"] }, "\(mirror.all.mapValues(\.value))")
        following.cancel()
        await following.value
    }
}
