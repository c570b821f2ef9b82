import ServiceLifecycle
import UserStoreCore

/// The index of the users a bucket holds (``ReplicaIndex``): loaded once at start.
extension LitestreamReplicator {
    /// Lists which users the bucket holds (one host, `s3://`), trying again every 5 s until the
    /// bucket answers; until then every new user asks the bucket itself.
    package func loadReplicaIndex() async {
        guard fencing == nil else { return }
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            // Only a listing of this data directory's replica (an empty mount point or an emptied
            // prefix listed as "nobody" would make every returning user a new one), taken while
            // this host holds the writer lease: nobody else writes under it from then on.
            if let identity, !identity.verdict.isVerified || lease.map({ $0.heldEpoch == nil }) ?? false {
                try? await Task.sleep(for: .seconds(1))
                continue
            }
            do {
                let started = ContinuousClock.now
                let generation = replicaIndex.beginListing()
                guard let users = try await storage.listUsers() else { return }
                guard replicaIndex.loaded(users, generation: generation) else { return } // a newer listing runs
                logger.info("replica index: \(users.count) users in the bucket, listed in \(ContinuousClock.now - started)")
                return
            } catch {
                logger.warning("replica index: listing the bucket failed (\(error)); new users ask the bucket until it answers")
                try? await Task.sleep(for: .seconds(5))
            }
        }
    }
}

/// What an operator does to the replica itself: `userstorectl replication init` and
/// `take-over` (docs/replication.md, "The replica's identity" and "One writer").
extension LitestreamReplicator {
    /// Why the replica cannot be initialised or taken over (`sftp://`, which the daemon cannot
    /// reach itself).
    package struct NotReachable: Error, CustomStringConvertible {
        package let description: String
    }

    /// Marks the replica configured as this data directory's, new (``ReplicaIdentity/initialize()``),
    /// lists it again for the index, and checks it at once. Returns its marker.
    package func initializeReplica() async throws -> ReplicaMarker {
        guard let identity else { throw NotReachable(description: "userstored keeps no marker in an sftp:// replica (it cannot reach it itself)") }
        let marker = try await BlockingPool.run { try identity.initialize() }
        replicaIndex.reset()
        Task { await self.loadReplicaIndex() }
        await checkReplica()
        // The writer lease at once (a replica without one gets its first): usable on return.
        if let lease { _ = try? await BlockingPool.run { lease.round() } }
        return marker
    }

    /// This host took the writer lease at `epoch`: the index of the bucket is listed again
    /// (another host may have written under the replica since it was listed).
    package func leaseAcquired(_ epoch: Int64) {
        replicaIndex.reset()
        Task { await self.loadReplicaIndex() }
    }

    /// Takes the writer lease at once under a new epoch (``LeaseKeeper/takeOver()``). Returns it
    /// and the one it replaced.
    package func takeOverReplica() async throws -> (held: ReplicaLease, previous: ReplicaLease?) {
        guard let lease else {
            throw NotReachable(description: fencing != nil
                ? "a cluster's hosts write to the replica as their buckets' owners (etcd): use userstorectl cluster move or drain"
                : "userstored keeps no lease in an sftp:// replica (it cannot reach it itself)")
        }
        return try await BlockingPool.run { try lease.takeOver() }
    }
}

