import Foundation
import ServiceLifecycle
import UserStoreCore

/// What the log engine does in the background (``LogHealthService``, every second): the fences
/// (``LogFencer``), the index's listing, the fold, the replica's check, and the journal's word on
/// upload outages.
extension LogReplicator {
    /// Lists the log's objects for the index once the replica is verified and this host holds
    /// it (the health service asks every second until it is in).
    func loadIndexIfDue() async {
        guard !index.isLoaded, identity.verdict.isVerified, lease.map({ $0.heldEpoch != nil }) ?? true else { return }
        let started = ContinuousClock.now
        do {
            try await fencer.fenceHeldEpoch()
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
                    if replicator.identity.verdict.isVerified { await replicator.fencer.fenceTakenBuckets() }
                    await replicator.loadIndexIfDue()
                    await replicator.foldIfDue()
                }
            }.value
            round += 1
            try? await Task.sleep(for: .seconds(1))
        }
    }
}
