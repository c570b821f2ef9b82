import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import UserStoreConfiguration
import UserStoreS3
import UserStoreCore

/// The daemon's own replication (`replication.engine: log`): every open store's commits, read
/// out of its WAL (``WALCapture``), go into one log per host (``LogUploader``) — group commit
/// across stores — and a store missing here is rebuilt from its records (``LogRestorer``). No
/// second process, and nothing kept per store but while it is open (docs/design.md, "The host
/// log"). In a cluster each host writes its own log; records carry their bucket's epoch, and a
/// host fences the buckets it takes before it reads their users (``LogFence``).
package final class LogReplicator: StoreReplication {
    package let settings: ReplicationSettings
    package let layout: StoreLayout
    package let storage: ReplicaStorage
    package let identity: ReplicaIdentity
    package let lease: LeaseKeeper?
    /// With more than one host: each user's bucket and its epoch (docs/cluster.md).
    package let cluster: (any ReplicaFencing)?
    package let uploader: LogUploader
    package let restorer: LogRestorer
    package let folder: LogFolder
    let fencer: LogFencer
    /// Copies in Litestream's layout (from before `engine: log`), each restored once with
    /// `litestream restore` when the log holds nothing of its user.
    let legacy: ReplicaRestorer
    let legacyLocations: ReplicaLocations
    /// Which log objects hold which users, listed once this host holds the replica.
    package let index = LogIndex()
    let logger: Logger

    struct State {
        /// The stores replicated now, by user.
        var open: [UserID: LoggedStore] = [:]
        var restored = 0
        var replicaProblem: String?
        var lastError: String?
        /// What the fold did since start, and why it last failed (while it fails).
        var folded = LogFolder.Report()
        var foldError: String?
        /// Since when writing log objects fails (nil: it does not).
        var uploadsFailingSince: Date?
    }

    let state = Mutex(State())
    /// The uploader's loop: started with the engine, stopped after every store's last records
    /// (``stop()``), so that it outlives the daemon's other services.
    private let uploading = Mutex<Task<Void, Never>?>(nil)

    package init(settings: ReplicationSettings, setup: ReplicaSetup, layout: StoreLayout, incarnation: Int,
                 cluster: (any ReplicaFencing)? = nil, logger: Logger, syncDuration: (@Sendable (Duration) -> Void)? = nil,
                 keyring: StoreKeyring? = nil) {
        self.settings = settings
        self.layout = layout
        storage = setup.storage
        identity = setup.identity
        lease = setup.lease
        self.cluster = cluster
        self.logger = logger
        let dataDirectory = setup.identity.binding.dataDirectory
        let padded = String(format: "%010d", incarnation)
        uploader = LogUploader(storage: setup.storage,
                               origin: .init(host: HostName.current, dataDirectory: dataDirectory, incarnation: padded,
                                             epoch: setup.lease?.pathEpoch ?? 0, folder: LogRestorer.folder + dataDirectory + "/" + padded + "/",
                                             cluster: cluster != nil),
                               settings: Self.uploaderSettings(settings), index: index, stored: syncDuration)
        let gate = AsyncLock()
        restorer = LogRestorer(storage: setup.storage, index: index, gate: gate, cluster: cluster != nil, keyring: keyring)
        folder = LogFolder(storage: setup.storage, index: index, uploader: uploader, gate: gate)
        fencer = LogFencer(lease: setup.lease, cluster: cluster, storage: setup.storage, uploader: uploader, index: index, gate: gate, logger: logger)
        legacyLocations = ReplicaLocations(replica: settings.replica, fencing: cluster, storage: setup.storage,
                                           identity: setup.identity, lease: setup.lease)
        legacy = ReplicaRestorer(locations: legacyLocations, command: LitestreamCommand(settings.litestream, environment: setup.storage.litestreamEnvironment),
                                 durableTimeoutMilliseconds: settings.durableTimeoutMilliseconds)
        if let problem = setup.problem { replicaFailed(problem) }
    }

    /// The engine on `setup`'s replica: this start's incarnation recorded, the uploader ready.
    package static func start(_ settings: ReplicationSettings, setup: ReplicaSetup, layout: StoreLayout, cluster: (any ReplicaFencing)? = nil,
                              logger: Logger, syncDuration: (@Sendable (Duration) -> Void)? = nil,
                              keyring: StoreKeyring? = nil) throws(ReplicaSetup.Refusal) -> LogReplicator {
        let identity = setup.identity
        let incarnation: Int
        do {
            incarnation = try identity.nextIncarnation()
        } catch {
            throw ReplicaSetup.Refusal(code: .unavailable, description: "recording this start in \(layout.replicaBindingPath): \(error)", name: nil)
        }
        let replicator = LogReplicator(settings: settings, setup: setup, layout: layout, incarnation: incarnation, cluster: cluster, logger: logger,
                                       syncDuration: syncDuration, keyring: keyring)
        let uploader = replicator.uploader
        replicator.uploading.withLock { $0 = Task { await uploader.run() } }
        return replicator
    }

    package var durableDeadline: ContinuousClock.Instant { .now + .milliseconds(settings.durableTimeoutMilliseconds) }

    /// How the uploader batches, from `replication.*`.
    static func uploaderSettings(_ settings: ReplicationSettings) -> LogUploader.Settings {
        var uploader = LogUploader.Settings()
        uploader.batchMilliseconds = settings.batchMilliseconds
        return uploader
    }

    // MARK: StoreReplication

    /// The epoch `user`'s store is written under now. In a cluster its bucket's (objects of a
    /// cluster are written under 0: each record carries its bucket's epoch); with one host, the
    /// writer lease's.
    func writingEpoch(of user: UserID) -> Int64 {
        cluster.map { $0.epoch(of: user) ?? 0 } ?? lease?.pathEpoch ?? 0
    }

    /// Marks the file at `path`, put in place here (restored, imported), as written under the
    /// epoch now, its base still to go out (a pending position): never continued, and never a
    /// store whose epoch is unknown.
    func baseDue(_ user: UserID, path: String) {
        if (try? LogPosition.shipping(stream: UInt64.random(in: 1...UInt64.max), epoch: writingEpoch(of: user), beside: path)) == nil {
            LogPosition.forget(path)
        }
    }

    package func storeOpened(_ store: Store) {
        let epoch = writingEpoch(of: store.user)
        let bucket = cluster.map { UInt16($0.bucket(of: store.user)) }
        if cluster == nil { uploader.raiseEpoch(to: epoch) }
        var position = LogPosition.load(store.path)
        if position?.epoch != epoch { position = nil } // a new epoch: a new stream, from a base
        if position?.pending == true { position = nil } // a base was on its way: again
        if let saved = position, !saved.matchesFile(store.path) {
            // Written by someone else since (its WAL checkpointed away): a base.
            position = nil
            logger.notice("\(store.user)'s database file changed while the daemon had it closed: it ships whole to the log", metadata: ["event": "replication-base-needed", "user": .string(store.user.rawValue)])
        }
        let logged = LoggedStore(store: store, epoch: epoch, bucket: bucket, uploader: uploader, position: position)
        do {
            let current = try logged.capture.resumeAfterCurrentContents()
            if let position, position.salt != nil || current.frames > 0 {
                // Frames after the saved position (a crash before they were all stored, or before
                // the position was saved): sent again, as one record (their txids are the same).
                if position.salt == nil || position.salt == current.salt, current.frames >= position.frames {
                    try logged.capture.resume(at: position.salt, frames: position.frames)
                    logged.committed(.success(try logged.capture.readCommits(through: current.frames)))
                } else {
                    logged.fail("the WAL is not where the position beside the store says")
                }
            }
        } catch {
            logged.fail("reading the WAL: \(error)")
        }
        store.keepsWALOnClose()
        store.wal.checkpoints(when: { [weak logged] in logged?.mayCheckpoint() ?? false }, then: { [weak logged] in logged?.checkpointed() },
                              otherwise: { [weak logged] in logged?.checkpointOnceStored() })
        if logged.needsBase && FileManager.default.fileExists(atPath: store.path) && Self.fileSize(store.path) > 0 {
            logged.shipBase()
        }
        store.wal.capture = logged.capture
        state.withLock { $0.open[store.user] = logged }
    }

    package func storeClosing(_ store: Store) async {
        // Closing the store's log state waits for a position being saved (an fsync): on the
        // blocking pool, as is everything here that touches the disk.
        guard let logged = await BlockingPool.run({ () -> LoggedStore? in
            guard let logged = self.state.withLock({ state -> LoggedStore? in
                guard state.open[store.user]?.store === store else { return nil }
                return state.open.removeValue(forKey: store.user)
            }) else { return nil }
            logged.close()
            store.wal.capture = nil
            return logged
        }) else { return }
        guard case .success(let last) = logged.lastRecord else { return }
        // Its last records stored: the WAL is checkpointed away and the position saved, so that
        // a reopen ships nothing. Otherwise the WAL stays, and a reopen ships what it holds.
        // While the log cannot be written, nothing waits for it: an eviction (a new user's
        // request), a bucket's release or a stop would each wait the durable time-out per store.
        if last != 0, !uploader.isStored(last) {
            guard !uploader.isFailing, await uploader.waitUntilStored(last, until: durableDeadline) else { return }
        }
        do {
            try await store.write { db in
                try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
                logged.checkpointed() // saves the position durably: in the store's turn, off the cooperative pool
            }
        } catch {
            logger.warning("checkpointing \(store.user) before it closes: \(error)", metadata: ["event": "replication-degraded"])
        }
    }

    package func storeReplaced(_ user: UserID, path: String) {
        baseDue(user, path: path)
    }

    package func storeErased(_ user: UserID, path: String) async throws {
        try await BlockingPool.executing { try await eraseOnPool(user, path: path) }
    }

    private func eraseOnPool(_ user: UserID, path: String) async throws {
        do {
            // A copy in Litestream's layout too (from before `engine: log`).
            try await storage.erase(legacyLocations.userFolderSuffix(user))
            index.forgetLegacy(user.rawValue)
            let eraser = LogEraser(storage: storage, uploader: uploader, folder: folder)
            // The user's last records stored first: while the log fails, the durable time-out;
            // otherwise at least 30 s (a backlog of every store's records may be ahead of them).
            let patience = Duration.milliseconds(uploader.isFailing ? settings.durableTimeoutMilliseconds : max(settings.durableTimeoutMilliseconds, 30_000))
            try await eraser.flush(until: .now + patience)
            // A refusal so far leaves the store as it was, its position included (without it the
            // next open asked the log for a newer copy — refused while the log is away — and then
            // set the store aside for it). From here on the erase removes the store's stream: if
            // it is cut short, the store's next open ships a base (a pending position).
            baseDue(user, path: path)
            try await eraser.erase(user.rawValue, epoch: cluster?.epoch(of: user))
            LogPosition.forget(path)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "erasing the user from the log: \(error); the local store is kept, retry")
        }
    }

    // MARK: What the daemon asks besides the registry

    /// Waits until every transaction committed to `user`'s store so far is in the replica, and
    /// may be acknowledged (``StoreError/replicationUnavailable(user:message:)`` otherwise), by
    /// `deadline`.
    package func waitUntilReplicated(_ user: UserID, until deadline: ContinuousClock.Instant) async throws {
        try identity.require(for: user)
        guard let logged = state.withLock({ $0.open[user] }) else {
            throw StoreError.replicationUnavailable(user: user, message: "the store is not open")
        }
        let last: UInt64
        switch logged.lastRecord {
        case .success(let number): last = number
        case .failure(let why): throw StoreError.replicationUnavailable(user: user, message: "\(why)")
        }
        if last > 0, await !uploader.waitUntilStored(last, until: deadline) {
            throw StoreError.replicationUnavailable(user: user, message: "the log did not store the commit within \(settings.durableTimeoutMilliseconds) ms (\(uploader.snapshot.lastError ?? "the replica is slow"))")
        }
        // Stored, and the lease confirmed recently (no request as a rule): a host that takes the
        // replica over later lists the object in its fence (LeaseKeeper.fenceNotBefore).
        if let lease, await !lease.confirmHeld(epoch: logged.epoch) {
            throw StoreError.replicationUnavailable(user: user, message: "committed here and in the log under epoch \(logged.epoch), but this host does not hold the replica's writer lease now: the write may be lost")
        }
    }

    /// The epoch `user`'s open store replicates under (nil: none, or not open).
    package func registeredEpoch(of user: UserID) -> Int64? {
        state.withLock { $0.open[user]?.epoch }
    }

    /// Where `user`'s copy is in the replica (for operators).
    package func replicaURL(for user: UserID) -> String { storage.describe(LogRestorer.folder) }

    /// How many users the index of the log holds, once listed.
    package var indexedUsers: Int? { index.users }
    /// What the daemon sent to the bucket since start, as its S3 client counted it (nil with a
    /// folder replica).
    package var bucketTraffic: S3Client.Traffic? {
        guard case .bucket(let client, _, _) = storage.kind else { return nil }
        return client.traffic
    }

    /// The replica could not be reached or verified (at start: served degraded).
    package func replicaFailed(_ problem: String) {
        state.withLock { $0.replicaProblem = problem }
    }

    /// An operator's call on the replica that this replica cannot take.
    package struct NotReachable: Error, CustomStringConvertible {
        package let description: String
    }

    /// `userstorectl replication init`.
    package func initializeReplica() async throws -> ReplicaMarker {
        let marker = try await identity.initialize()
        await checkReplica()
        if let lease { await lease.round() }
        return marker
    }

    package func takeOverReplica() async throws -> (held: ReplicaLease, previous: ReplicaLease?) {
        guard let lease else { throw NotReachable(description: "no writer lease in this replica") }
        return try await lease.takeOver()
    }

    /// A lease taken at a new epoch: objects are written under it, the log is fenced and then
    /// listed again (another host may have written it meanwhile).
    package func leaseAcquired(_ epoch: Int64) {
        uploader.raiseEpoch(to: epoch)
        index.reset()
    }

    /// What `Status`, `userstorectl replication` and the metrics show.
    package var snapshot: ReplicationSnapshot {
        // An outage's end is logged before anything shows replication ok again.
        reportUploads()
        let upload = uploader.snapshot
        return state.withLock { state in
            let stores = state.open.values.map { (user: $0.user.rawValue, registered: !$0.needsBase) }
            let log = ReplicationSnapshot.LogState(tailObjects: index.objects ?? 0, oldestUnstoredSeconds: upload.oldestUnstoredSeconds,
                                                   pendingBytes: upload.pendingBytes, objectsWritten: upload.objects,
                                                   objectsFolded: state.folded.logObjects, foldError: state.foldError)
            return ReplicationSnapshot(registered: stores.filter(\.registered).count, unregistered: stores.filter { !$0.registered }.count,
                                       lastError: upload.lastError ?? state.lastError, restored: state.restored,
                                       replicaProblem: state.replicaProblem, syncs: upload.objects,
                                       stores: stores.sorted { $0.user < $1.user }, holdsLease: lease.map { $0.heldEpoch != nil } ?? true, log: log)
        }
    }

    /// The log's background work (health checks, the fold, fences), run with the daemon's
    /// services until shutdown.
    package func services(registry: StoreRegistry) -> [any Service] {
        [LogHealthService(replicator: self)]
    }

    /// Whether what the stores closed so far committed is in the replica, waiting for it until
    /// `deadline` (a cluster releases a moving bucket only then).
    package func lastCommitsStored(until deadline: ContinuousClock.Instant) async -> Bool {
        await uploader.flush(until: deadline)
    }

    /// Waits (at most the durable time-out) for the log to store what the stores' last commits
    /// appended, then stops the uploader. Returns whether every record was stored: only then may
    /// another host take the stores over (what this one stored after that host's fence would
    /// not count).
    @discardableResult
    package func stop() async -> Bool {
        let stored = await uploader.flush(until: durableDeadline)
        if !stored {
            logger.warning("stopping with records the log did not store (\(uploader.snapshot.lastError ?? "the replica is slow")): the stores ship them when they next open", metadata: ["event": "replication-degraded"])
        }
        uploading.withLock { $0 }?.cancel()
        await uploading.withLock { $0 }?.value
        return stored
    }

    // MARK: Helpers

    private static func fileSize(_ path: String) -> Int {
        var status = stat()
        return stat(path, &status) == 0 ? Int(status.st_size) : 0
    }
}
