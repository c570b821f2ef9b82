import Foundation
import Logging
import Synchronization
import UserStoreCore

/// Writes the log's fences (``LogFence``) for the host log: after this host takes the replica's
/// lease, or in a cluster a bucket, what the earlier holders upload later must not count. One
/// fence per epoch (and in a cluster one for all the buckets taken at once), written before the
/// log is read under it — by a restore, the index's listing or the fold — and never two at once.
final class LogFencer: Sendable {
    let lease: LeaseKeeper?
    let cluster: (any ReplicaFencing)?
    let storage: ReplicaStorage
    let uploader: LogUploader
    let index: LogIndex
    /// The restorer's and the fold's gate: a cluster's fence refreshes the index under it.
    let gate: AsyncLock
    let logger: Logger

    /// The epoch whose fence this host wrote (nil: none yet).
    private let fenced = Mutex<Int64?>(nil)
    /// Held while a fence is written, so that two never race their compare-and-swaps.
    private let writing = AsyncLock()
    /// In a cluster: the epoch this host last fenced each bucket at, and how many fences it wrote.
    private let fencedBuckets = Mutex<(epochs: [UInt16: Int64], written: Int)>(([:], 0))
    /// Fencing the buckets this host took fails (said once until it works again).
    private let takenFailing = Mutex(false)

    init(lease: LeaseKeeper?, cluster: (any ReplicaFencing)?, storage: ReplicaStorage, uploader: LogUploader,
         index: LogIndex, gate: AsyncLock, logger: Logger) {
        self.lease = lease
        self.cluster = cluster
        self.storage = storage
        self.uploader = uploader
        self.index = index
        self.gate = gate
        self.logger = logger
    }

    /// Writes the fence of the epoch this host holds, once per epoch, before the log is read under
    /// it (a restore, the index's listing, the fold).
    func fenceHeldEpoch() async throws {
        guard let lease, let epoch = lease.heldEpoch, fenced.withLock({ $0 }) != epoch else { return }
        try await writing.exclusive {
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

    /// In a cluster: fences the buckets this host took since the last look (from
    /// ``LogHealthService``, every second, once the replica is verified), so that what their
    /// earlier owners upload after it never counts — and their folds can tell — even before a
    /// user of them is restored.
    func fenceTakenBuckets() async {
        guard let cluster else { return }
        let owned = cluster.ownedEpochsSeen
        guard !owned.isEmpty else { return }
        do {
            try await fenceBuckets(owned)
            takenFailing.withLock { $0 = false }
        } catch {
            // Once per outage: it is tried again every second.
            guard takenFailing.withLock({ failing in defer { failing = true }; return !failing }) else { return }
            logger.warning("fencing the log for the buckets this host took: \(error); tried again every second, and before any of their users is restored",
                           metadata: ["event": "replication-degraded"])
        }
    }

    /// In a cluster: writes one fence for those of `wanted` (buckets at their epochs) this host
    /// has not fenced at that epoch, then reads into the index what the fence's listing holds
    /// that it does not know (other hosts' objects): a restore of the bucket's users, after it,
    /// reads all that counts.
    private func fenceBuckets(_ wanted: [Int: Int64]) async throws {
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
        try await writing.exclusive { try await fenceBucketsAlone(due()) }
    }

    /// ``fenceBuckets(_:)`` for `buckets`, holding ``writing``.
    private func fenceBucketsAlone(_ buckets: [UInt16: Int64]) async throws {
        guard let highest = buckets.values.max() else { return }
        let number = fencedBuckets.withLock { $0.written + 1 }
        let origin = uploader.origin
        let key = LogFence.clusterKey(dataDirectory: origin.dataDirectory, incarnation: origin.incarnation, number: number)
        try await gate.exclusive { [storage, index] in
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
}
