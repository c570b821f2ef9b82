import Foundation
import Logging
import Synchronization
import UserStoreConfiguration
import UserStoreCore

/// Every open store replicated by Litestream (docs/replication.md): registered when it opens,
/// synced and unregistered when it closes, restored from the replica when it is missing here.
///
/// While Litestream cannot be reached the daemon goes on serving (degraded): durable writes fail
/// with `ReplicationUnavailable`, and ``checkHealth()`` (run every second by
/// ``ReplicationMonitor``) registers every open store again once Litestream answers — also after
/// Litestream restarted and forgot them. A store registered again after such a fault counts as
/// replicated only once its replica was compared with it (``ReplicaCheck``).
///
/// **The WAL rule.** Litestream keeps, in memory, where it stopped reading each store's WAL, and
/// when it finds the WAL shorter than that position after it had read to the end, it takes the
/// reset for one of its own checkpoints and carries on from the new WAL's start: frames that
/// another connection checkpointed meanwhile never reach the replica (issue #36: a 5 MB write
/// lost after a paused Litestream came back). So the daemon resets a replicated store's WAL —
/// its own checkpoint of a store Litestream does not replicate — only when no running
/// Litestream may hold a position in it: none ever got the store's registration, or it
/// confirmed the unregistration, or that Litestream process has ended. A Litestream that is
/// alive but does not answer (paused, hung) holds its positions: its stores' WALs grow until it
/// answers again, or until the daemon kills it (``ReplicationMonitor``, child mode).
final class LitestreamReplicator: StoreReplication {
    let settings: ReplicationSettings
    let layout: StoreLayout
    let control: LitestreamControl
    /// One `/sync` at a time per store (Litestream mishandles overlapping ones), shared by the
    /// durable writes that wait for it (group commit).
    let syncLanes = SyncLanes<LitestreamControl.SyncReply>()
    let command: LitestreamCommand
    let logger: Logger
    let state = Mutex(State())

    struct State {
        /// Open stores by path.
        var open: [String: OpenStore] = [:]
        /// The last failure talking to Litestream, while it lasts.
        var lastError: String?
        var degradedSince: Date?
        /// Per registered path: when Litestream last synced it (`/list`).
        var lastSync: [String: Date] = [:]
        /// The Litestream that last answered `/info`.
        var litestream: LitestreamControl.Instance?
        /// Since when no Litestream answers (nil while one does).
        var unansweredSince: ContinuousClock.Instant?
        /// Stores brought back from the replica since start.
        var restored = 0
        /// Closed stores whose unregistration the running Litestream did not confirm: it may
        /// still hold their WAL position (so their WAL was kept at close), and their files are
        /// not replaced until it lets go.
        var unconfirmed: Set<String> = []
        /// With more than one host: the epoch each open store was last registered under.
        var epochs: [String: Int64] = [:]
        /// Replicas found to differ from their store, and resnapshotted, since start.
        var diverged = 0
        /// How long the last sync pass took.
        var lastPass: Duration = .zero
        /// The longest sync pass since start: what the plain-write loss window's bound depends on.
        var longestPass: Duration = .zero
        /// What the last check of the replica itself found wrong (its named error), while it lasts.
        var replicaProblem: String?
    }

    /// One open store, as replication sees it.
    struct OpenStore {
        let store: Store
        /// Litestream replicates it, and it counts as replicated: durable writes may wait for it.
        var registered = false
        /// Since when its registration may have reached the running Litestream, which may then
        /// hold a position in its WAL: until that Litestream confirms the unregistration, leaves
        /// it out of a `/list` asked for later, or ends, the daemon never resets the WAL.
        var heldSince: ContinuousClock.Instant?
        /// Since when that Litestream is known to hold it: its registration was answered, or a
        /// `/list` showed it. A `/list` asked for later that lacks the store means Litestream
        /// forgot it (it restarted). Not ``heldSince``: a `/list` served while the registration
        /// is still on its way lacks the store too, and that Litestream is about to hold it.
        var confirmedSince: ContinuousClock.Instant?

        /// No running Litestream holds a position in its WAL any more.
        mutating func released() {
            heldSince = nil
            confirmedSince = nil
        }
    }

    /// With more than one host: each user's bucket and its epoch, which fence the replica paths.
    let fencing: (any ReplicaFencing)?
    /// The replica itself, for what the daemon does there (erase, find epochs, check).
    let storage: ReplicaStorage
    /// Which users the bucket holds (one host, `s3://`), once listed: ``loadReplicaIndex()``.
    let replicaIndex = ReplicaIndex()

    /// Told how long each sync took (the metrics, when they are served).
    let syncDuration: (@Sendable (Duration) -> Void)?
    /// What Litestream sent to the bucket, from its Prometheus page
    /// (`replication.litestreamMetricsAddress`; nil when it has none).
    let bucketTraffic: BucketTraffic?

    init(settings: ReplicationSettings, storage: ReplicaStorage, layout: StoreLayout, logger: Logger, fencing: (any ReplicaFencing)? = nil,
         syncDuration: (@Sendable (Duration) -> Void)? = nil) {
        self.settings = settings
        self.syncDuration = syncDuration
        self.bucketTraffic = settings.litestreamMetricsAddress.map(BucketTraffic.init(address:))
        self.storage = storage
        self.layout = layout
        self.fencing = fencing
        self.control = LitestreamControl(socketPath: settings.socket)
        self.command = LitestreamCommand(settings.litestream, environment: storage.litestreamEnvironment)
        self.logger = logger
    }

    /// The durable time-out from now: how long a durable write, a final sync or an
    /// unregistration waits for Litestream.
    var durableDeadline: ContinuousClock.Instant { .now + .milliseconds(settings.durableTimeoutMilliseconds) }

    // MARK: StoreReplication

    /// The epoch `user`'s open store was registered under (more than one host); nil otherwise.
    func registeredEpoch(of user: UserID) -> Int64? {
        state.withLock { $0.epochs[layout.storePath(for: user)] }
    }

    func newerCopy(of user: UserID, path: String) throws -> Int64? {
        guard fencing != nil else { return nil }
        let newest: Int64?
        do {
            newest = try newestEpochWithData(user)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "looking for a newer copy in the replica: \(error)")
        }
        guard let newest else { return nil }
        let local = (try? String(contentsOfFile: Self.epochFile(of: path), encoding: .utf8)).flatMap { Int64($0) } ?? 0
        return newest > local ? newest : nil
    }

    func storeOpened(_ store: Store) {
        let register = state.withLock { state -> Bool in
            // The running Litestream may still hold the store from before it was closed (it did
            // not confirm the unregistration): held as it is, and the health check settles it.
            let held = state.unconfirmed.remove(store.path) != nil
            state.open[store.path] = OpenStore(store: store, heldSince: held ? .now : nil)
            // Not registered here while no Litestream answers either: the health check registers
            // it once one does, instead of this open waiting for a time-out.
            return state.unansweredSince == nil && !held
        }
        if register { _ = self.register(store) } else { updateCheckpointing(of: store) }
    }

    func storeClosing(_ store: Store) {
        // Only this store's own entry: a request may already have opened the file again (a new
        // Store), whose registration must stay.
        let entry = state.withLock { state -> OpenStore? in
            guard state.open[store.path]?.store === store else { return nil }
            state.lastSync[store.path] = nil
            state.epochs[store.path] = nil
            return state.open.removeValue(forKey: store.path)
        }
        guard let entry else { return }
        let deadline = durableDeadline
        if entry.registered {
            do {
                // Litestream opens a registered database lazily (on its first sync, within a
                // second); unregistering one it has not opened yet skips the final sync. A sync
                // first opens it and copies everything; the unregister's own sync finds little.
                _ = try control.syncAndWait(store.path, until: deadline)
            } catch {
                failed("final sync of \(store.user)", error)
            }
        }
        // The WAL stays as it is (one host): the next registration finds Litestream's position
        // in it where the last one stopped and ships only what changed since — closing must not
        // reset it, or every reopen ships a snapshot of the whole store (issue #38, "Reopening
        // costs what changed" in docs/replication.md). With more than one host a reopen may
        // replicate to a new epoch's folder, which needs the snapshot.
        if fencing == nil { store.keepsWALOnClose() }
        guard entry.heldSince != nil || state.withLock({ $0.unconfirmed.contains(store.path) }) else { return }
        do {
            try control.unregister(store.path, until: deadline)
            state.withLock { _ = $0.unconfirmed.remove(store.path) }
        } catch {
            // It may still read this WAL from where it stopped: closing must not reset it.
            state.withLock { _ = $0.unconfirmed.insert(store.path) }
            store.keepsWALOnClose()
            if entry.registered { failed("unregister \(store.user)", error) }
        }
    }

    func storeReplaced(_ user: UserID, path: String, deleteReplica: Bool) throws {
        // A Litestream that may still hold the old file would ship the new one's pages against
        // the old position (or bring a deleted replica back): it must confirm it let go first.
        if state.withLock({ $0.unconfirmed.contains(path) }) {
            do {
                try control.unregister(path, until: durableDeadline)
                state.withLock { _ = $0.unconfirmed.remove(path) }
            } catch {
                throw StoreError.replicationUnavailable(user: user, message: "Litestream has not confirmed it stopped replicating the store (\(error)); retry")
            }
        }
        try? FileManager.default.removeItem(atPath: Self.sidecar(of: path))
        try? FileManager.default.removeItem(atPath: Self.epochFile(of: path))
        guard deleteReplica else { return }
        let url = withSuffix(userFolderSuffix(user))
        guard storage.canErase else {
            throw StoreError.replicationUnavailable(user: user, message: "userstored erases only file:// and s3:// replicas; delete \(url) with the storage's own tools, then delete the store")
        }
        do {
            try storage.erase(userFolderSuffix(user))
            replicaIndex.remove(user.rawValue)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "erasing the replica \(url) (every epoch and its history): \(error); nothing was deleted here, retry")
        }
    }

    // MARK: Registration

    /// Registers `store` with Litestream (blocking); on failure the health check registers it
    /// once Litestream answers.
    @discardableResult
    func register(_ store: Store) -> Bool {
        guard holdForRegistration(store) else { return false }
        do {
            let url = try prepareRegistration(store)
            try control.register(store.path, replicaURL: url)
            return registered(store)
        } catch {
            notRegistered(store, error)
            return false
        }
    }

    /// Marks `store` held before its registration goes out (a checkpoint of ours must not race
    /// Litestream's first sync of it); false when it was closed meanwhile.
    func holdForRegistration(_ store: Store) -> Bool {
        guard state.withLock({ state -> Bool in
            guard state.open[store.path]?.store === store else { return false }
            state.open[store.path]!.heldSince = .now
            state.open[store.path]!.confirmedSince = nil
            return true
        }) else { return false }
        updateCheckpointing(of: store)
        return true
    }

    /// The replica URL to register `store` under; with more than one host, records its epoch
    /// beside the store first (durably: it must survive a crash).
    func prepareRegistration(_ store: Store) throws -> String {
        // Before Litestream can ship anything of it: a listing running now may miss it.
        replicaIndex.insert(store.user.rawValue)
        let (url, epoch) = replicaLocation(for: store.user)
        if let epoch {
            try DurableFile.write(String(epoch), to: Self.epochFile(of: store.path))
            state.withLock { $0.epochs[store.path] = epoch }
        }
        return url
    }

    /// Litestream took `store`: it counts as registered (the normal open). False when it was
    /// closed meanwhile, and then Litestream is told to let go again.
    func registered(_ store: Store) -> Bool {
        let stillOpen = state.withLock { state -> Bool in
            guard state.open[store.path]?.store === store else { return false }
            state.open[store.path]!.registered = true
            state.open[store.path]!.confirmedSince = .now
            return true
        }
        if !stillOpen { try? control.unregister(store.path, until: durableDeadline) }
        return stillOpen
    }

    /// A registration that failed: if it never reached Litestream, nothing holds the WAL.
    func notRegistered(_ store: Store, _ error: any Error) {
        if let failure = error as? LitestreamControl.Failure, !failure.delivered {
            state.withLock { state in
                if state.open[store.path]?.store === store { state.open[store.path]!.released() }
            }
        }
        updateCheckpointing(of: store)
        failed("register \(store.user)", error)
    }

    /// Sets each open store's own checkpointing (only `store`'s, when given): on for a store
    /// Litestream does not replicate (nobody else checkpoints it, and its WAL would grow without
    /// end) — unless a running Litestream may hold a position in its WAL (the WAL rule above).
    func updateCheckpointing(of store: Store? = nil) {
        let (entries, gone) = state.withLock { state in
            let entries = store.map { store in state.open[store.path].map { [$0] } ?? [] } ?? Array(state.open.values)
            return (entries, state.litestream.map { Self.hasEnded($0.pid) } ?? false)
        }
        for entry in entries {
            entry.store.wal.checkpointsItself = !entry.registered && (entry.heldSince == nil || gone)
        }
    }

    /// Whether process `pid` has ended (and been reaped): then no Litestream holds what it held.
    static func hasEnded(_ pid: Int32) -> Bool {
        pid > 0 && kill(pid, 0) != 0 && errno == ESRCH
    }

    // MARK: Health

    /// What `Status` and `userstorectl replication` show.
    struct Snapshot: Sendable {
        var registered: Int
        var unregistered: Int
        var lastError: String?
        var litestreamPID: Int
        var litestreamVersion: String
        var restored: Int
        var diverged: Int
        var lastSyncPassSeconds: Double
        var longestSyncPassSeconds: Double
        var replicaProblem: String?
        /// Syncs asked of Litestream since start, and durable waits answered by a sync another
        /// caller had queued (``SyncLanes``: group commit).
        var syncs: Int
        var sharedSyncWaits: Int
        /// Per open store: its user, whether it is registered, its last sync.
        var stores: [(user: String, registered: Bool, lastSync: Date?)]
        var degraded: Bool { unregistered > 0 || lastError != nil || replicaProblem != nil }
        /// The longest time since Litestream last synced an open, registered store.
        var maxLagSeconds: Double {
            let now = Date()
            return stores.filter(\.registered).compactMap { $0.lastSync.map { now.timeIntervalSince($0) } }.max() ?? 0
        }
    }

    var snapshot: Snapshot {
        let syncCounts = syncLanes.counts
        return state.withLock { state in
            let stores = state.open.map { path, entry in (user: entry.store.user.rawValue, registered: entry.registered, lastSync: state.lastSync[path]) }
            return Snapshot(registered: stores.filter(\.registered).count, unregistered: stores.filter { !$0.registered }.count,
                            lastError: state.lastError, litestreamPID: Int(state.litestream?.pid ?? 0),
                            litestreamVersion: state.litestream?.version ?? "", restored: state.restored, diverged: state.diverged,
                            lastSyncPassSeconds: state.lastPass.inSeconds, longestSyncPassSeconds: state.longestPass.inSeconds,
                            replicaProblem: state.replicaProblem,
                            syncs: syncCounts.started, sharedSyncWaits: syncCounts.joined,
                            stores: stores.sorted { $0.user < $1.user })
        }
    }

    /// Records a failure; the first one of an outage is logged as `replication-degraded`.
    func failed(_ what: String, _ error: any Error) {
        let message = "\(what): \(error)"
        let first = state.withLock { state -> Bool in
            defer { state.lastError = message }
            guard state.degradedSince == nil else { return false }
            state.degradedSince = Date()
            return true
        }
        if first {
            logger.error("replication degraded: \(message); serving on, stores are registered again when Litestream answers", metadata: [
                "event": "replication-degraded", "error": .string(message),
            ])
        }
    }

    /// Every open store is registered (and, after the fault, checked): the outage is over.
    func recovered(checked: Int) {
        let since = state.withLock { state -> Date? in
            defer { state.degradedSince = nil; state.lastError = nil }
            return state.degradedSince
        }
        if let since {
            logger.notice("replication recovered: every open store is registered again, \(checked) compared with its replica", metadata: [
                "event": "replication-recovered", "degraded_seconds": .stringConvertible(Int(Date().timeIntervalSince(since))),
                "checked": .stringConvertible(checked),
            ])
        }
    }

    /// Litestream's last log lines without their timestamps: the reason it gives.
    static func lastLines(_ output: String) -> String {
        let lines = output.split(separator: "\n").map { line -> String in
            if let message = line.range(of: "msg=") { return String(line[message.upperBound...]) }
            return String(line)
        }
        return lines.suffix(2).joined(separator: "; ")
    }

    /// Whether Litestream's failure says the replica's data is bad rather than unreachable.
    static func isDamage(_ message: String) -> Bool {
        let lowered = message.lowercased()
        // Not "decode" alone: Litestream wraps transport errors as "decode database: …" too.
        // Format errors name what was wrong with the data (a page header, a checksum, lz4).
        return ["integrity", "checksum", "corrupt", "malformed", "decompress", "invalid ltx", "invalid page", "magic"].contains { lowered.contains($0) }
    }
}

/// Epoch-fenced replica paths, with more than one host (docs/cluster.md): each owner of a
/// bucket replicates its users under the bucket's epoch, so a host that lost the bucket (and
/// may still ship what it had) writes where the next owner never reads after its first write.
protocol ReplicaFencing: Sendable {
    /// `user`'s bucket.
    func bucket(of user: UserID) -> Int
    /// The epoch of `user`'s bucket as this host sees it (nil: no owner record seen).
    func epoch(of user: UserID) -> Int64?
}

extension Duration {
    /// The duration in seconds, as a Double (Status and metrics).
    var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
