import Foundation
import GRDB

/// Opens, creates, restores, migrates and closes one store's files — the file work behind a
/// ``StoreRegistry``'s transitions, which decides when (``RegistryState``) and runs it in a task
/// of its own. Holds no state of its own.
struct StorePreparer: Sendable {
    let configuration: RegistryConfiguration
    let opener: StoreOpener
    let observer: any StoreObserver
    let replication: (any StoreReplication)?
    /// The group commit of fleet runs (``MigrationPolicy/FleetSyncMethod/syncfs``).
    let fleetSync: FileSystemSync
    /// Which versions each store may be migrated to now (a staged release); nil: all.
    let gate: (any MigrationGate)?

    /// Opens (creating it, from `template` if given) and migrates a store nobody else can reach
    /// yet, in one blocking-pool job without hops (with replication, after the replica was asked
    /// for a newer copy or a restore: ``prepareFromReplica(_:restoring:)``, a job of
    /// its own and the replica's work; with encryption, after the store's key was fetched:
    /// ``StoreOpener/cipher(for:create:)``, which looks at the file and reads the key store
    /// first). Fails only when the file cannot be opened.
    /// Without a `migrator`, only opens an existing file. With `closeAfter`, closes the store
    /// once its migration succeeded (`closed` in the result): in the same job without
    /// replication, else once the replicator has taken its last commits (``close(_:)``).
    ///
    /// With `replication`, a local copy another host wrote past since is set aside and the
    /// replica's restored (on any open); a store missing here is restored from the replica if
    /// it has one (when migrating); an existing store is registered before anything writes to
    /// it (the migration), a new one once migrated.
    func openAndMigrate(_ user: UserID, template: StoreTemplate?, migrator: Migrator?,
                        closeAfter: Bool) async -> Result<(Store, Result<MigrationReport?, any Error>, closed: Bool), StoreError> {
        let (opener, observer, replication) = (self.opener, self.observer, self.replication)
        do {
            let restored = try await prepareFromReplica(user, restoring: migrator != nil)
            let cipher = try await opener.cipher(for: user, create: migrator != nil)
            let (store, migration, closing) = try await BlockingPool.run { () throws -> (Store, Result<MigrationReport?, any Error>, Bool) in
                // The template is plaintext: an encrypted store is migrated step by step (and a
                // restored one is not new).
                let template = opener.keyring == nil && !restored ? template : nil
                let (store, created) = try opener.open(user, template: template, create: migrator != nil, cipher: cipher)
                // An existing store is registered before anything writes to it (the migration
                // included): its commits continue its stream. A new one only once migrated: it
                // ships whole anyway, and then its base holds its migration (one object, not two).
                if !created { replication?.storeOpened(store) }
                if !created && !restored { observer.record(.storeOpened(user: user)) }
                guard let migrator else { return (store, .success(nil), false) }
                if created { observer.record(.storeCreated(user: user, path: store.path, templateVersion: template?.schemaVersion)) }
                let copied = created ? template : nil
                let migration = Result { () throws -> MigrationReport? in
                    try store.writeBlocking { db in
                        var report = try migrator.migrate(db, created: created)
                        if !created { store.migrated(report) }
                        if let copied {
                            try Bookkeeping.stampCreation(db)
                            report.fromVersion = 0
                            report.applied = copied.applied + report.applied
                        }
                        return report
                    }
                }.mapError { error -> any Error in
                    // What this connection shows may not be on disk: never served from it.
                    guard let notDurable = error as? Migrator.NotDurable else { return error }
                    store.markDamaged(notDurable.failure.description)
                    return notDurable.failure
                }
                if created { replication?.storeOpened(store) }
                guard closeAfter, case .success = migration else { return (store, migration, false) }
                observer.record(.storeClosed(user: user, idle: true))
                // Without replication in the same job; a replicated store first waits for the
                // log to store its last commits, which is no job for a pool thread.
                if replication == nil { store.close() }
                return (store, migration, true)
            }
            if closing, replication != nil { await close(store) }
            return .success((store, migration, closing))
        } catch {
            return .failure(StoreError.from(error, user: user))
        }
    }

    /// With replication, before `user`'s store is opened: a local copy another host has written
    /// past since this one last owned the store (more than one host) is set aside, and the
    /// replica's newer copy restored — for an open as is too (the fleet index reading a version),
    /// which would otherwise ship the stale copy as a base over the newer one; with `restoring`
    /// (an open that may create the store), a store missing here is restored from the replica if
    /// it holds one. Returns whether a copy was restored. The replica is asked with no thread
    /// blocked; the files are looked at on the blocking pool. Without replication: nothing.
    private func prepareFromReplica(_ user: UserID, restoring: Bool) async throws -> Bool {
        guard let replication else { return false }
        let (layout, observer) = (opener.layout, self.observer)
        let path = layout.storePath(for: user)
        // One hop for a new user: the look and its folder.
        let exists = try await BlockingPool.run { () throws -> Bool in
            if FileManager.default.fileExists(atPath: path) { return true }
            if restoring { try FileManager.default.createDirectory(atPath: layout.storeDirectory(for: user), withIntermediateDirectories: true) }
            return false
        }
        if exists {
            guard let supersededBy = try await replication.newerCopy(of: user, path: path) else { return false }
            let aside = try await BlockingPool.run { try StoreFiles.setAside(path, tag: "superseded-e\(supersededBy)") }
            observer.record(.storeSuperseded(user: user, setAsideAt: aside, epoch: supersededBy))
        } else if !restoring {
            return false
        }
        guard let copy = try await replication.restore(user, to: path, timestamp: nil) else { return false }
        observer.record(.storeRestored(user: user, source: copy.source, schemaVersion: copy.schemaVersion,
                                       durationMicroseconds: copy.durationMicroseconds))
        return true
    }

    /// How a fleet run's job makes `user`'s store, which it closes right after, durable: a
    /// replicated store's checkpoints are its replicator's (never past what the replica holds),
    /// so each of its commits is synced.
    func fleetDurability(for user: UserID) -> Migrator.Durability {
        if opener.replicated { return .lastCommit }
        // Before Linux 5.8, syncfs does not report write-back errors: sync file by file there,
        // and for a store on another file system than the data directory's (a folder mounted
        // inside it), which the shared syncfs would not write back.
        let shared = configuration.policy.fleetSyncMethod == .syncfs && FileSystemSync.reportsWriteBackErrors
            && fleetSync.covers(opener.layout.storePath(for: user))
        return shared ? .shared(fleetSync) : .checkpoint
    }

    /// `syncfs` calls fleet runs have made so far (for tests).
    var fleetFileSystemSyncs: UInt64 { fleetSync.statistics.syncs }

    /// The migrator for `user`, held to the versions the gate allows it now; a `simulating`
    /// one (for plans run on a copy, the new-store template) takes no backups, reports no
    /// events and is not gated.
    func makeMigrator(_ user: UserID, migrations: MigrationSet, simulating: Bool = false,
                      durability: Migrator.Durability = .lastCommit) -> Migrator {
        var policy = configuration.policy
        if simulating { policy.backupBeforeMigrating = .never }
        var migrator = Migrator(user: user, migrations: migrations, appVersion: configuration.appVersion, policy: policy,
                                observer: simulating ? NoStoreObserver() : observer, backups: BackupKeeper(layout: configuration.layout))
        migrator.durability = durability
        if !simulating { migrator.allowed = gate?.allowedVersions(for: user) }
        return migrator
    }

    /// Closing checkpoints the WAL (disk I/O), so it runs on the blocking pool, not the
    /// cooperative pool. GRDB's close waits for work already queued on the store.
    ///
    /// A replicated store is synced and unregistered first, once the work queued on it is done
    /// (its last commit is then the last the replicator saw).
    func close(_ store: Store) async {
        if let replication {
            await BlockingPool.run { store.finishQueuedWork() }
            await replication.storeClosing(store)
        }
        await BlockingPool.run { store.close() }
    }
}
