import ClusterTestSupport
import Foundation
import Testing
@testable import UserStoreCluster

/// A host's lease and its local deadline, against a real etcd member that is paused.
@Suite(.serialized) struct HostMembershipTests {
    @Test func aHostWhoseEtcdStopsAnsweringStopsAcknowledgingBeforeItsLeaseCanEnd() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints, requestTimeout: .milliseconds(500))
        let membership = HostMembership(etcd: etcd, host: "a", record: "{\"address\":\"127.0.0.2:7001\"}", ttlSeconds: 3, margin: .milliseconds(500))
        try await membership.join()
        #expect(membership.mayAcknowledge)
        #expect(try await etcd.get(HostMembership.key(of: "a"))?.lease == membership.lease)
        let keeping = Task { await membership.keepAlive() }
        // Past several TTLs, kept alive all along.
        let watched = ContinuousClock.now
        while ContinuousClock.now - watched < .seconds(4) {
            #expect(membership.mayAcknowledge)
            try await Task.sleep(for: .milliseconds(100)) // sampling period, not a wait for an event
        }
        // etcd paused: the host gives up acknowledging at TTL - margin (2.5 s) after its last
        // keepalive was *sent*, which was before the pause; etcd cannot end the lease before
        // 3 s after it *arrived*. (The deadline itself is checked, not when this loop noticed:
        // on a loaded machine the loop may wake late.)
        cluster.pause(0)
        let paused = ContinuousClock.now
        while membership.mayAcknowledge, ContinuousClock.now - paused < .seconds(10) {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(!membership.mayAcknowledge)
        let deadline = try #require(membership.deadline)
        #expect(deadline - paused <= .milliseconds(2500), "acknowledged until \(deadline - paused) after etcd stopped answering (TTL 3 s, margin 0.5 s)")
        print("cluster: acknowledged until \(deadline - paused) after etcd paused (TTL 3 s, margin 0.5 s)")
        // etcd back: the host acknowledges again (same lease, or a new one and its record again).
        cluster.resume(0)
        let resumed = ContinuousClock.now
        while !membership.mayAcknowledge, ContinuousClock.now - resumed < .seconds(15) {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(membership.mayAcknowledge)
        #expect(try await etcd.get(HostMembership.key(of: "a"))?.lease == membership.lease)
        await membership.leave()
        await keeping.value
        #expect(!membership.mayAcknowledge)
        #expect(try await etcd.get(HostMembership.key(of: "a")) == nil)
    }

    @Test func aSecondLiveHostWithTheSameNameIsRefused() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let first = HostMembership(etcd: etcd, host: "b", record: "{}", ttlSeconds: 5)
        try await first.join()
        let second = HostMembership(etcd: etcd, host: "b", record: "{}", ttlSeconds: 5)
        await #expect(throws: ClusterError.hostNameTaken("b")) { try await second.join() }
        #expect(!second.mayAcknowledge)
        // Once the first leaves, the name is free.
        await first.leave()
        try await second.join()
        #expect(second.mayAcknowledge)
        await second.leave()
    }
}
