import DaemonTestSupport
import Foundation
import Logging
import Testing
import UserStoreConfiguration
import UserStoreCore
@testable import UserStoreReplication

/// The writer lease's rules (``LeaseKeeper``) on a real `file://` replica, each host a keeper
/// with a data directory of its own: who takes it when, at which epoch, and what the holder that
/// lost it may still do. The daemons' side is in WriterLeaseTests.
@Suite(.serialized) struct LeaseKeeperTests {
    /// A replica folder and keepers on it, each with its own data directory.
    final class Replica: Sendable {
        let folder = try! TemporaryDirectory()
        var storage: ReplicaStorage { try! ReplicaStorage(ReplicationSettings(replica: "file://" + folder.path)) }

        /// A keeper for the data directory `directory` (a new one when nil), its replica's
        /// marker checked.
        func keeper(host: String = "host", directory: TemporaryDirectory? = nil, leaseSeconds: Int = 3) async throws -> (LeaseKeeper, TemporaryDirectory) {
            let data = try directory ?? TemporaryDirectory()
            let identity = try ReplicaIdentity(storage: storage, layout: StoreLayout(dataDirectory: data.path), host: host,
                                               replicaURL: "file://" + folder.path, logger: Logger(label: "test"))
            #expect(await identity.check().isVerified)
            return (LeaseKeeper(storage: storage, identity: identity, host: host, leaseSeconds: leaseSeconds, logger: Logger(label: "test")), data)
        }

        var lease: ReplicaLease? {
            FileManager.default.contents(atPath: folder.path + "/" + ReplicaLease.name).flatMap { ReplicaLease(json: $0) }
        }
    }

    /// The first keeper takes a new lease; a second waits while the first renews, and takes
    /// the lease — at a higher epoch — only after it has seen it unrenewed for the whole lease;
    /// the first then finds it lost and may acknowledge nothing.
    @Test func anotherHostTakesTheLeaseOnlyOnceItWasUnrenewedForTheWholeLease() async throws {
        // On the blocking pool's threads, as the daemon runs its rounds: the timing below must
        // not depend on the cooperative pool, which synchronous tests running beside hold.
        try await BlockingPool.executing {
            let replica = Replica()
            let (a, _) = try await replica.keeper(host: "a")
            let (b, _) = try await replica.keeper(host: "b")
            #expect(await a.round())
            let epoch = try #require(a.heldEpoch)
            #expect(a.mayAcknowledge(epoch: epoch) && !a.mayAcknowledge(epoch: nil) && !a.mayAcknowledge(epoch: epoch - 1))
            #expect(await !b.round() && b.snapshot.state == "standby" && b.snapshot.holder == "a")
            #expect(throws: StoreError.self) { try b.admit(UserID("ann")) }
            // The holder renews (its lease changes every third of it): the other never takes over.
            let until = ContinuousClock.now + .seconds(4)
            while ContinuousClock.now < until {
                await a.round()
                #expect(await !b.round())
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(a.heldEpoch == epoch && b.heldEpoch == nil)
            // The holder stops renewing: after the lease's time the other takes it.
            let stopped = ContinuousClock.now
            while await !b.round() { try await Task.sleep(for: .milliseconds(200)) }
            #expect(ContinuousClock.now - stopped >= .seconds(2), "taken over too early")
            let taken = try #require(b.heldEpoch)
            #expect(taken > epoch && replica.lease?.holder == "b" && replica.lease?.epoch == taken)
            #expect(!a.mayAcknowledge(epoch: epoch), "a holder past its lease acknowledged")
            #expect(await !a.round() && a.heldEpoch == nil && a.snapshot.losses == 1 && a.snapshot.holder == "b")
        }
    }

    /// A lease given up (a clean stop) is taken at once: by the same data directory (a restart)
    /// at the same epoch, by another at a new one. A lease of the same data directory that was
    /// not given up and whose process may live (a cloned machine, a copied directory) is taken
    /// only after the whole lease, at a new epoch: two processes never write under one epoch.
    @Test func aReleasedLeaseIsTakenAtOnceAndALiveOneOfTheSameDirectoryIsNot() async throws {
        // On the blocking pool's threads, as the daemon runs its rounds: the timing below must
        // not depend on the cooperative pool, which synchronous tests running beside hold.
        try await BlockingPool.executing {
            let replica = Replica()
            let (a, aData) = try await replica.keeper(host: "a")
            #expect(await a.round())
            let epoch = try #require(a.heldEpoch)
            let (clone, _) = try await replica.keeper(host: "a", directory: aData)
            #expect(await !clone.round(), "a second process of the same data directory took a lease that is alive")
            await a.release()
            #expect(replica.lease?.released == true)
            let (restarted, _) = try await replica.keeper(host: "a", directory: aData)
            #expect(await restarted.round() && restarted.heldEpoch == epoch, "a restart after a clean stop waited, or took a new epoch")
            #expect(await !clone.round(), "the clone took the restarted process's lease")
            // The restarted process stops renewing; the clone takes the lease after seeing it
            // unrenewed for the whole lease, at a new epoch.
            let stopped = ContinuousClock.now
            while await !clone.round() { try await Task.sleep(for: .milliseconds(200)) }
            #expect(ContinuousClock.now - stopped >= .seconds(2))
            let cloneEpoch = try #require(clone.heldEpoch)
            #expect(cloneEpoch > epoch)
            await clone.release()
            let (b, _) = try await replica.keeper(host: "b")
            #expect(await b.round() && (b.heldEpoch ?? 0) > cloneEpoch, "another data directory took a released lease late, or at an old epoch")
        }
    }

    /// An operator's take-over takes a lease its holder still renews, at once and at a higher
    /// epoch. The old holder cannot know at once and acknowledges until its last confirmation is
    /// ``LeaseKeeper/confirmationWindow`` old — before the new holder may write its fence; after
    /// that, its look finds the lease lost, and a durable write it confirms is refused.
    @Test func aTakeOverFencesTheHolderOnlyOnceItStoppedAcknowledging() async throws {
        // On the blocking pool's threads, as the daemon runs its rounds: the timing below must
        // not depend on the cooperative pool, which synchronous tests running beside hold.
        try await BlockingPool.executing {
            let replica = Replica()
            let (a, _) = try await replica.keeper(host: "a", leaseSeconds: 60)
            let (b, _) = try await replica.keeper(host: "b", leaseSeconds: 60)
            #expect(await a.round())
            let epoch = try #require(a.heldEpoch)
            #expect(await !b.round())
            #expect(b.fenceNotBefore <= .now, "a host that took a lease from nobody waits to fence")
            let (held, previous) = try await b.takeOver()
            #expect(held.epoch > epoch && previous?.holder == "a" && b.mayAcknowledge(epoch: held.epoch))
            #expect(a.mayAcknowledge(epoch: epoch), "the holder cannot know yet")
            #expect(await a.confirmHeld(epoch: epoch), "the holder refused within its confirmation window")
            let acknowledgesUntil = try #require(a.acknowledgesUntil)
            #expect(acknowledgesUntil < b.fenceNotBefore, "the new holder may fence while the old one still acknowledges")
            try await Task.sleep(until: acknowledgesUntil)
            #expect(!a.mayAcknowledge(epoch: epoch))
            #expect(await !a.confirmHeld(epoch: epoch), "a durable write was confirmed under a lease taken over")
            #expect(a.heldEpoch == nil && a.snapshot.losses == 1)
        }
    }

    /// The folder's compare-and-swap under contention: of many writers on the same version,
    /// exactly one wins.
    @Test func oneOfManyConcurrentSwapsWins() async throws {
        let replica = Replica()
        let storage = replica.storage
        let version = try #require(try await storage.writeObject("object", Data("start".utf8), condition: .absent))
        let winners = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<16 {
                group.addTask { (try? await storage.writeObject("object", Data("writer \(index)".utf8), condition: .matching(version))) ?? nil != nil }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(winners == 1)
        #expect(try await storage.writeObject("object", Data("late".utf8), condition: .absent) == nil)
    }
}
