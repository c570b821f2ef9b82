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
package final class LitestreamReplicator: ReplicationEngine {
    package let settings: ReplicationSettings
    package let layout: StoreLayout
    package let control: LitestreamControl
    /// One `/sync` at a time per store (Litestream mishandles overlapping ones), shared by the
    /// durable writes that wait for it (group commit).
    package let syncLanes = SyncLanes<LitestreamControl.SyncReply>()
    package let command: LitestreamCommand
    package let logger: Logger
    package let state = Mutex(State())

    /// What replication knows now (``ReplicationState``), under its lock.
    package typealias State = ReplicationState

    /// With more than one host: each user's bucket and its epoch, which fence the replica paths.
    package let fencing: (any ReplicaFencing)?
    /// The replica itself, for what the daemon does there (erase, find epochs, check).
    package let storage: ReplicaStorage
    /// Which users the bucket holds (one host, `s3://`), once listed: ``loadReplicaIndex()``.
    package let replicaIndex = ReplicaIndex()
    /// Where each user's copy lives in the replica.
    package let locations: ReplicaLocations
    /// `litestream restore`, for stores missing here and for comparisons.
    package let restorer: ReplicaRestorer

    /// Told how long each sync took (the metrics, when they are served).
    package let syncDuration: (@Sendable (Duration) -> Void)?
    /// What Litestream sent to the bucket, from its Prometheus page
    /// (`replication.litestreamMetricsAddress`; nil when it has none).
    package let bucketTraffic: BucketTraffic?

    /// The replica's marker against the data directory's binding (nil for `sftp://`).
    package let identity: ReplicaIdentity?
    /// With one host on a `file://` or `s3://` replica: the writer lease (nil in a cluster, whose
    /// writers are its bucket owners, and for `sftp://`).
    package let lease: LeaseKeeper?

    /// The Litestream the daemon runs as its child (`replication.startLitestream`).
    package let process: LitestreamProcess?

    package init(settings: ReplicationSettings, storage: ReplicaStorage, layout: StoreLayout, logger: Logger, fencing: (any ReplicaFencing)? = nil,
                 identity: ReplicaIdentity? = nil, lease: LeaseKeeper? = nil, process: LitestreamProcess? = nil,
                 syncDuration: (@Sendable (Duration) -> Void)? = nil) {
        self.process = process
        self.settings = settings
        self.syncDuration = syncDuration
        self.bucketTraffic = settings.litestreamMetricsAddress.map(BucketTraffic.init(address:))
        self.storage = storage
        self.layout = layout
        self.fencing = fencing
        self.identity = identity
        self.lease = lease
        self.control = LitestreamControl(socketPath: settings.socket)
        self.command = LitestreamCommand(settings.litestream, environment: storage.litestreamEnvironment)
        self.logger = logger
        locations = ReplicaLocations(replica: settings.replica, fencing: fencing, storage: storage, replicaIndex: replicaIndex,
                                     identity: identity, lease: lease)
        restorer = ReplicaRestorer(locations: locations, command: command, durableTimeoutMilliseconds: settings.durableTimeoutMilliseconds)
    }

    /// The durable time-out from now: how long a durable write, a final sync or an
    /// unregistration waits for Litestream.
    package var durableDeadline: ContinuousClock.Instant { .now + .milliseconds(settings.durableTimeoutMilliseconds) }

    // MARK: StoreReplication

    package func restore(_ user: UserID, to path: String, timestamp: Date?) throws -> ReplicaRestore? {
        // A replica that vanished or is another one: nothing is restored, and nothing created.
        try identity?.require(for: user)
        let restored = try restorer.restore(user, to: path, timestamp: timestamp)
        if restored != nil { state.withLock { $0.restored += 1 } }
        return restored
    }

    /// The epoch `user`'s open store was registered under (more than one host); nil otherwise.
    package func registeredEpoch(of user: UserID) -> Int64? {
        state.withLock { $0.epochs[layout.storePath(for: user)] }
    }

    package func newerCopy(of user: UserID, path: String) throws -> Int64? {
        guard fencing != nil || lease != nil else { return nil }
        let local = (try? String(contentsOfFile: ReplicaLocations.epochFile(of: path), encoding: .utf8)).flatMap { Int64($0) } ?? 0
        // One host: a store last replicated under the epoch this host holds is current (nobody
        // else writes under it); one from before another host held the lease may not be.
        if fencing == nil, let held = lease?.heldEpoch, local == held { return nil }
        let newest: Int64?
        do {
            newest = try locations.newestEpochWithData(user)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "looking for a newer copy in the replica: \(error)")
        }
        try locations.requireNotAboveLease(newest, user)
        guard let newest else { return nil }
        return newest > local ? newest : nil
    }

    package func storeOpened(_ store: Store) {
        let register = state.withLock { state -> Bool in
            // The running Litestream may still hold the store from before it was closed (it did
            // not confirm the unregistration): held as it is, and the health check settles it.
            let held = state.unconfirmed.remove(store.path) != nil
            state.open[store.path] = ReplicatedStore(store: store, heldSince: held ? .now : nil)
            // Not registered here while no Litestream answers either: the health check registers
            // it once one does, instead of this open waiting for a time-out.
            return state.unansweredSince == nil && !held
        }
        if register { _ = self.register(store) } else { updateCheckpointing(of: store) }
    }

    package func storeClosing(_ store: Store) {
        // Only this store's own entry: a request may already have opened the file again (a new
        // Store), whose registration must stay.
        let entry = state.withLock { state -> ReplicatedStore? in
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

    package func storeReplaced(_ user: UserID, path: String, deleteReplica: Bool) throws {
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
        try? FileManager.default.removeItem(atPath: ReplicaLocations.sidecar(of: path))
        // The new file is what this host (the lease's holder, the bucket's owner) means the store
        // to be now: current at the epoch in force, so that its next open does not take an older
        // epoch's copy in the replica for a newer one and put it back over an import or a
        // restore. A deleted store has none.
        if !deleteReplica, let epoch = locations.replicaLocation(for: user).epoch {
            try? DurableFile.write(String(epoch), to: ReplicaLocations.epochFile(of: path))
        } else {
            try? FileManager.default.removeItem(atPath: ReplicaLocations.epochFile(of: path))
        }
        guard deleteReplica else { return }
        let url = locations.withSuffix(locations.userFolderSuffix(user))
        guard storage.canErase else {
            throw StoreError.replicationUnavailable(user: user, message: "userstored erases only file:// and s3:// replicas; delete \(url) with the storage's own tools, then delete the store")
        }
        do {
            try storage.erase(locations.userFolderSuffix(user))
            replicaIndex.remove(user.rawValue)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "erasing the replica \(url) (every epoch and its history): \(error); nothing was deleted here, retry")
        }
    }

    // MARK: Registration

    /// Registers `store` with Litestream (blocking); on failure the health check registers it
    /// once Litestream answers.
    @discardableResult
    package func register(_ store: Store) -> Bool {
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
    package func holdForRegistration(_ store: Store) -> Bool {
        guard state.withLock({ state -> Bool in
            guard state.open[store.path]?.store === store else { return false }
            state.open[store.path]!.heldSince = .now
            state.open[store.path]!.confirmedSince = nil
            return true
        }) else { return false }
        updateCheckpointing(of: store)
        return true
    }

    /// The replica URL to register `store` under, with the epoch it carries (the writer
    /// lease's with one host, the bucket's with more), recorded beside the store first
    /// (durably: it must survive a crash).
    package func prepareRegistration(_ store: Store) throws -> String {
        let (url, epoch) = locations.replicaLocation(for: store.user)
        if lease != nil && epoch == nil {
            throw LitestreamControl.Failure(description: "this host has never held the replica's writer lease: nothing is replicated", delivered: false)
        }
        // Before Litestream can ship anything of it: a listing running now may miss it.
        replicaIndex.insert(store.user.rawValue)
        if let epoch {
            let file = ReplicaLocations.epochFile(of: store.path)
            let recorded = (try? String(contentsOfFile: file, encoding: .utf8)).flatMap { Int64($0) }
            // One host under a new epoch: Litestream's state beside the store names its place in
            // the old epoch's folder; without it Litestream ships a snapshot into the new one
            // instead of LTX files that continue what the new folder never had.
            if fencing == nil, recorded != epoch, !state.withLock({ $0.unconfirmed.contains(store.path) }) {
                try? FileManager.default.removeItem(atPath: ReplicaLocations.sidecar(of: store.path))
            }
            if recorded != epoch { try DurableFile.write(String(epoch), to: file) }
            state.withLock { $0.epochs[store.path] = epoch }
        }
        return url
    }

    /// Litestream took `store`: it counts as registered (the normal open). False when it was
    /// closed meanwhile, and then Litestream is told to let go again.
    package func registered(_ store: Store) -> Bool {
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
    package func notRegistered(_ store: Store, _ error: any Error) {
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
    package func updateCheckpointing(of store: Store? = nil) {
        let (entries, gone) = state.withLock { state in
            let entries = store.map { store in state.open[store.path].map { [$0] } ?? [] } ?? Array(state.open.values)
            return (entries, state.litestream.map { Self.hasEnded($0.pid) } ?? false)
        }
        for entry in entries {
            entry.store.wal.checkpointsItself = !entry.registered && (entry.heldSince == nil || gone)
        }
    }

    /// Whether process `pid` has ended (and been reaped): then no Litestream holds what it held.
    package static func hasEnded(_ pid: Int32) -> Bool {
        pid > 0 && kill(pid, 0) != 0 && errno == ESRCH
    }

    // MARK: Health

    /// Records a failure; the first one of an outage is logged as `replication-degraded`.
    package func failed(_ what: String, _ error: any Error) {
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
    package func recovered(checked: Int) {
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

}

/// Epoch-fenced replica paths, with more than one host (docs/cluster.md): each owner of a
/// bucket replicates its users under the bucket's epoch, so a host that lost the bucket (and
/// may still ship what it had) writes where the next owner never reads after its first write.
package protocol ReplicaFencing: Sendable {
    /// `user`'s bucket.
    func bucket(of user: UserID) -> Int
    /// The epoch of `user`'s bucket as this host sees it (nil: no owner record seen).
    func epoch(of user: UserID) -> Int64?
    /// The buckets this host owns at their epochs, as its copy of the records shows them now.
    var ownedEpochsSeen: [Int: Int64] { get }
    /// The buckets this host owns now at their epochs, by a linearizable read of etcd (the log
    /// engine's fold and fences). Throws when etcd does not answer.
    func ownedEpochs() async throws -> [Int: Int64]
}

