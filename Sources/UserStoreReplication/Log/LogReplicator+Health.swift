import Foundation
import ServiceLifecycle
import UserStoreCore

/// What the log engine does in the background (``LogHealthService``, every second): the fence of
/// a newly held epoch, the index's listing, the fold, the replica's check, and the journal's word
/// on upload outages.
extension LogReplicator {
    /// Writes the fence of the epoch this host holds, once per epoch, before the log is read under
    /// it (a restore, the index's listing, the fold).
    func fenceIfDue() async throws {
        guard let lease, let epoch = lease.heldEpoch, fenced.withLock({ $0 }) != epoch else { return }
        try await fencing.exclusive {
            guard fenced.withLock({ $0 }) != epoch else { return }
            // After an operator's take-over, the old holder may still acknowledge for a few seconds
            // what it stores: the fence waits until it cannot (LeaseKeeper.fenceNotBefore).
            try await Task.sleep(until: lease.fenceNotBefore)
            uploader.raiseEpoch(to: epoch)
            let (fence, _) = try await LogFence.write(epoch: epoch, holder: HostName.current, storage: storage, log: LogRestorer.folder)
            fenced.withLock { $0 = epoch }
            logger.info("fenced the log at epoch \(epoch): \(fence.through.count) log folders, what their holders upload later does not count",
                        metadata: ["event": "replica-lease-held", "epoch": "\(epoch)"])
        }
    }

    /// In a cluster: fences `user`'s bucket at its epoch now, unless this host did (with every
    /// other bucket it owns at an epoch not fenced yet: one fence for all).
    func fenceBucket(of user: UserID) async throws {
        guard let cluster, let epoch = cluster.epoch(of: user) else { return }
        let bucket = cluster.bucket(of: user)
        // Fenced already: nothing to wait for (another bucket's fence is the health service's).
        if let fenced = fencedBuckets.withLock({ $0.epochs[UInt16(truncatingIfNeeded: bucket)] }), fenced >= epoch { return }
        var wanted = cluster.ownedEpochsSeen
        wanted[bucket] = epoch
        try await fenceBuckets(wanted)
    }

    /// In a cluster: writes one fence for those of `wanted` (buckets at their epochs) this host
    /// has not fenced at that epoch, then reads into the index what the fence's listing holds
    /// that it does not know (other hosts' objects): a restore of the bucket's users, after it,
    /// reads all that counts.
    func fenceBuckets(_ wanted: [Int: Int64]) async throws {
        @Sendable func due() -> [UInt16: Int64] {
            fencedBuckets.withLock { fenced in
                var due: [UInt16: Int64] = [:]
                for (bucket, epoch) in wanted {
                    guard let bucket = UInt16(exactly: bucket), (fenced.epochs[bucket] ?? .min) < epoch else { continue }
                    due[bucket] = epoch
                }
                return due
            }
        }
        guard !due().isEmpty else { return }
        try await fencing.exclusive { try await fenceBucketsAlone(due()) }
    }

    /// ``fenceBuckets(_:)`` for `buckets`, holding ``fencing``.
    private func fenceBucketsAlone(_ buckets: [UInt16: Int64]) async throws {
        guard let highest = buckets.values.max() else { return }
        let number = fencedBuckets.withLock { $0.written + 1 }
        let origin = uploader.origin
        let key = LogFence.clusterKey(dataDirectory: origin.dataDirectory, incarnation: origin.incarnation, number: number)
        try await folder.gate.exclusive { [storage, index] in
            let (_, listed) = try await LogFence.write(epoch: highest, holder: origin.host, storage: storage, log: LogRestorer.folder,
                                                       buckets: Dictionary(uniqueKeysWithValues: buckets.map { (String($0.key), $0.value) }),
                                                       dataDirectory: origin.dataDirectory, key: key)
            try await index.refresh(from: storage, listed: listed, fences: try await LogFences.load(from: storage, known: index.knownFences),
                                    own: LogRestorer.folder + origin.dataDirectory + "/")
        }
        fencedBuckets.withLock { fenced in
            fenced.written = number
            for (bucket, epoch) in buckets { fenced.epochs[bucket] = max(fenced.epochs[bucket] ?? epoch, epoch) }
        }
        logger.info("fenced the log for \(buckets.count) buckets this host took (up to epoch \(highest)): what their earlier owners upload later does not count",
                    metadata: ["event": "cluster-buckets-fenced", "count": "\(buckets.count)"])
    }

    /// In a cluster: fences the buckets this host took since the last look (from
    /// ``LogHealthService``, every second), so that what their earlier owners upload after it
    /// never counts — and their folds can tell — even before a user of them is restored.
    func fenceTakenBuckets() async {
        guard let cluster, identity.verdict.isVerified else { return }
        let owned = cluster.ownedEpochsSeen
        guard !owned.isEmpty else { return }
        do {
            try await fenceBuckets(owned)
            state.withLock { $0.fenceFailing = false }
        } catch {
            // Once per outage: it is tried again every second.
            guard state.withLock({ state in defer { state.fenceFailing = true }; return !state.fenceFailing }) else { return }
            logger.warning("fencing the log for the buckets this host took: \(error); tried again every second, and before any of their users is restored",
                           metadata: ["event": "replication-degraded"])
        }
    }

    /// Lists the log's objects for the index once the replica is verified and this host holds
    /// it (the health service asks every second until it is in).
    func loadIndexIfDue() async {
        guard !index.isLoaded, identity.verdict.isVerified, lease.map({ $0.heldEpoch != nil }) ?? true else { return }
        let started = ContinuousClock.now
        do {
            try await fenceIfDue()
            try await index.load(from: storage, log: LogRestorer.folder, folds: LogFolder.root)
            logger.info("log index: \(index.objects ?? 0) objects listed in \(ContinuousClock.now - started)")
        } catch {
            logger.warning("log index: listing the log failed (\(error)); restores read every object until it is in")
        }
    }

    /// Folds the log objects older than `replication.foldSeconds` into per-user objects (from
    /// ``LogHealthService``, every second), while this host holds the verified replica.
    func foldIfDue() async {
        guard index.isLoaded, identity.verdict.isVerified, lease.map({ $0.heldEpoch != nil }) ?? true else { return }
        let cutoff = Date() - TimeInterval(settings.foldSeconds)
        do {
            while true {
                var view: LogFolder.ClusterView?
                if let cluster {
                    // What of this host's objects counts: the buckets it owns, read after they were stored.
                    guard folder.hasWork(before: cutoff) else { break }
                    let stored = uploader.storedSequence
                    let owned = try await cluster.ownedEpochs()
                    view = LogFolder.ClusterView(owned: Dictionary(uniqueKeysWithValues: owned.compactMap { bucket, epoch in
                        UInt16(exactly: bucket).map { ($0, epoch) }
                    }), storedThrough: stored)
                }
                guard let report = try await folder.fold(before: cutoff, cluster: view) else { break }
                state.withLock { state in
                    state.folded.logObjects += report.logObjects
                    state.folded.users += report.users
                    state.folded.snapshots += report.snapshots
                    state.folded.bytesWritten += report.bytesWritten
                    state.foldError = nil
                }
                if report.logObjects < 64 { break }
            }
        } catch {
            let first = state.withLock { state -> Bool in
                defer { state.foldError = "\(error)" }
                return state.foldError == nil
            }
            if first {
                logger.warning("folding the log into per-user objects failed: \(error); the log keeps its objects and the fold tries again",
                               metadata: ["event": "replication-degraded"])
            }
        }
    }

    /// Logs the start and the end of an outage of the log's uploads (from ``LogHealthService``,
    /// every second): `replication-degraded` once when objects start failing, with why, and
    /// `replication-recovered` once they are stored again.
    func reportUploads() {
        let upload = uploader.snapshot
        enum Change { case began(String), ended(Date) }
        let change = state.withLock { state -> Change? in
            switch (upload.lastError, state.uploadsFailingSince) {
            case (let error?, nil):
                state.uploadsFailingSince = Date()
                return .began(error)
            case (nil, let since?):
                state.uploadsFailingSince = nil
                return .ended(since)
            default:
                return nil
            }
        }
        switch change {
        case .began(let error):
            logger.error("replication degraded: \(error); stores are served, commits wait in memory (\(upload.pendingBytes) bytes now) and are written once the replica answers; durable writes fail meanwhile", metadata: [
                "event": "replication-degraded", "error": .string(error),
            ])
        case .ended(let since):
            logger.notice("replication recovered: the log's objects are stored again", metadata: [
                "event": "replication-recovered", "degraded_seconds": .stringConvertible(Int(Date().timeIntervalSince(since))),
            ])
        case nil:
            break
        }
    }

    /// Checks the replica's marker (every 5 s from ``LogHealthService``, every second while it fails).
    package func checkReplica() async {
        let verdict = await identity.check()
        state.withLock { $0.replicaProblem = verdict.problem }
        if verdict.isVerified, let lease, lease.heldEpoch == nil { await lease.round() }
    }
}

/// The replica's marker checked every 5 s (every second while it fails).
struct LogHealthService: Service {
    let replicator: LogReplicator

    func run() async throws {
        var round = 0
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            // In a task of its own, which a stop does not cancel: a check cut off mid-request
            // would log the replica as unverified. On the blocking pool's threads: the fold
            // decodes and compresses, and a listing of a large log decodes headers, which must
            // not hold Swift's cooperative pool.
            await Task { [replicator, round] in
                await BlockingPool.executing {
                    if round % 5 == 0 || replicator.snapshot.replicaProblem != nil { await replicator.checkReplica() }
                    replicator.reportUploads()
                    await replicator.fenceTakenBuckets()
                    await replicator.loadIndexIfDue()
                    await replicator.foldIfDue()
                }
            }.value
            round += 1
            try? await Task.sleep(for: .seconds(1))
        }
    }
}
