import ClusterTestSupport
import Foundation
import Testing
@testable import UserStoreCluster

/// The controller election and bucket assignment against a real etcd member, with three hosts
/// in this process (their memberships and controllers, not whole daemons).
@Suite(.serialized) struct ClusterControllerTests {
    struct Host {
        let membership: HostMembership
        let controller: ClusterController
    }

    static func hosts(_ names: [String], etcd: EtcdClient) async throws -> [String: Host] {
        var hosts: [String: Host] = [:]
        for name in names {
            let membership = HostMembership(etcd: etcd, host: name, record: "{}", ttlSeconds: 10)
            try await membership.join()
            hosts[name] = Host(membership: membership, controller: ClusterController(etcd: etcd, membership: membership))
        }
        return hosts
    }

    /// Every bucket's record: owner and epoch.
    static func owners(_ etcd: EtcdClient) async throws -> [Int: (owner: String, epoch: Int64)] {
        var owners: [Int: (String, Int64)] = [:]
        for item in try await etcd.list(prefix: BucketRecord.prefix) {
            owners[BucketRecord.bucket(ofKey: item.key)!] = (BucketRecord(json: item.value)!.owner, item.modRevision)
        }
        return owners
    }

    @Test func oneControllerAssignsEveryBucketAndADepartedHostsBucketsAloneMove() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let hosts = try await Self.hosts(["a", "b", "c"], etcd: etcd)
        // All three try at once: one wins and assigns all 4096 buckets.
        let assigned = try await withThrowingTaskGroup(of: Int.self) { group in
            for host in hosts.values { group.addTask { try await host.controller.round() } }
            return try await group.reduce(0, +)
        }
        #expect(assigned == Placement.bucketCount)
        let controllers = hosts.filter { $0.value.controller.isController }.map(\.key)
        #expect(controllers.count == 1)
        let before = try await Self.owners(etcd)
        #expect(before.count == Placement.bucketCount)
        #expect(before.allSatisfy { $0.value.owner == Placement.rendezvousOwner(of: $0.key, among: ["a", "b", "c"]) })

        // A host that is not the controller leaves: only its buckets move, to the rendezvous
        // owner among the others, each at a new epoch; every other epoch stays.
        let leaving = ["a", "b", "c"].first { $0 != controllers[0] }!
        await hosts[leaving]!.membership.leave()
        let moved = try await hosts[controllers[0]]!.controller.round()
        let after = try await Self.owners(etcd)
        let survivors = ["a", "b", "c"].filter { $0 != leaving }
        #expect(moved == before.values.filter { $0.owner == leaving }.count)
        for bucket in 0..<Placement.bucketCount {
            if before[bucket]!.owner == leaving {
                #expect(after[bucket]!.owner == Placement.rendezvousOwner(of: bucket, among: survivors))
                #expect(after[bucket]!.epoch > before[bucket]!.epoch)
            } else {
                #expect(after[bucket]! == before[bucket]!)
            }
        }
        // Nothing left to do: a further round moves nothing.
        #expect(try await hosts[controllers[0]]!.controller.round() == 0)

        // The controller itself leaves: another host takes the key and its buckets.
        await hosts[controllers[0]]!.membership.leave()
        let last = survivors.first { $0 != controllers[0] }!
        #expect(try await hosts[last]!.controller.round() > 0)
        #expect(hosts[last]!.controller.isController)
        #expect(try await Self.owners(etcd).values.allSatisfy { $0.owner == last })
        await hosts[last]!.membership.leave()
    }

    @Test func aControllerThatLostItsLeaseCannotWriteAnyRecord() async throws {
        let cluster = try EtcdCluster(size: 1)
        let etcd = EtcdClient(endpoints: cluster.endpoints)
        let hosts = try await Self.hosts(["a", "b"], etcd: etcd)
        try await hosts["a"]!.controller.round()
        #expect(hosts["a"]!.controller.isController)
        let staleLease = hosts["a"]!.membership.lease
        // a's lease ends (as if it were paused past its TTL); b becomes controller.
        try await etcd.revokeLease(staleLease)
        try await hosts["b"]!.controller.round()
        #expect(hosts["b"]!.controller.isController)
        let before = try await Self.owners(etcd)
        #expect(before.values.allSatisfy { $0.owner == "b" })
        // a, waking up with its old lease, sees b gone and itself live (records written by
        // hand here) and tries to take every bucket: its transactions are refused.
        try await etcd.put(HostMembership.key(of: "a"), "{}")
        try await etcd.delete(HostMembership.key(of: "b"))
        #expect(try await hosts["a"]!.controller.assign(lease: staleLease) == 0)
        #expect(try await Self.owners(etcd).mapValues(\.epoch) == before.mapValues(\.epoch))
    }

    @Test func aBucketRecordRoundTripsAndBadKeysAreNotBuckets() {
        let record = BucketRecord(owner: "host-a", state: .draining)
        #expect(record.json == "{\"owner\":\"host-a\",\"state\":\"draining\"}")
        #expect(BucketRecord(json: Array(record.json.utf8)) == record)
        #expect(BucketRecord(json: Array("{\"owner\":1}".utf8)) == nil)
        #expect(BucketRecord.bucket(ofKey: "/us/v1/buckets/4095") == 4095)
        #expect(BucketRecord.bucket(ofKey: "/us/v1/buckets/4096") == nil)
        #expect(BucketRecord.bucket(ofKey: "/us/v1/buckets/x") == nil)
    }
}
