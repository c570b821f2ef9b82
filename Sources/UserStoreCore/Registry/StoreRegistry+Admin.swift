import Foundation
import GRDB

/// What an operator can do to one store through the registry (so the daemon stays the only
/// process that touches the files).
extension StoreRegistry {
    /// What migrating `user`'s store would do, without changing anything (a store that does not
    /// exist is not created).
    public func plan(_ user: UserID) async throws -> MigrationPlan {
        let migrations = self.migrations
        let migrator = preparer.makeMigrator(user, migrations: migrations)
        let simulator = preparer.makeMigrator(user, migrations: migrations, simulating: true)
        // An existing store is read through the daemon's own connection to it, as it is (a
        // lease would migrate it first); a missing one is planned as the empty database it would
        // start from, and not created.
        let existing: MigrationPlan?
        do {
            existing = try await withExistingStore(user) { store in
                try await store.read { db in try MigrationPlan.make(db, migrator: migrator, simulator: simulator, schema: migrations.schema, created: false) }
            }
        } catch StoreError.noSuchStore {
            existing = nil
        }
        if let existing { return existing }
        return try await BlockingPool.run {
            try DatabaseQueue().read { db in try MigrationPlan.make(db, migrator: migrator, simulator: simulator, schema: migrations.schema, created: true) }
        }
    }

    /// Migrates `user`'s store now: creates it if absent, and retries a failed migration.
    /// Throws the ``StoreError`` of a migration that fails again.
    public func migrate(_ user: UserID) async throws -> MigrationReport {
        let lease = try await acquire(user, access: .admin, mode: .migrate)
        defer { release(user) }
        if let report = lease.report { return report }
        // Its migration failed just now, for this call: that is the outcome (a retry could be
        // held back by a release the failure has just halted, and would read as "held").
        if lease.preparedNow, let failure = lease.failure, case .migrationFailed = failure { throw failure }
        // A store whose last commits may not be on disk (a failed shared sync) or that SQLite
        // found corrupt: finding nothing to migrate would call it current.
        if let damage = lease.store.damaged { throw StoreError.storeDamaged(user: user, message: damage) }
        let migrator = preparer.makeMigrator(user, migrations: migrations)
        do {
            let store = lease.store
            let report = try await store.write { db in store.migrated(try migrator.migrate(db, created: false)) }
            setPhase(user, ready: true)
            return report
        } catch {
            let failure = StoreError.from(error, user: user)
            setPhase(user, ready: false, failure: failure)
            throw failure
        }
    }

    /// Rolls `user`'s store back to `version` with the Down sections (the files', or the ones
    /// recorded when the migrations were applied). Returns the versions undone, newest first,
    /// and the store's schema version afterwards.
    ///
    /// While the daemon still knows the newer migrations, the next request migrates the store
    /// forward again: roll back after removing or fixing those files (and reloading).
    public func rollback(_ user: UserID, to version: Int64) async throws -> (undone: [Int64], schemaVersion: Int64) {
        try await withStore(user, access: .admin) { store in
            let migrator = preparer.makeMigrator(user, migrations: migrations)
            defer { setPhase(user, ready: false, stale: true) }
            do {
                return try await store.write { db in
                    let undone = try migrator.rollback(db, to: version)
                    if !undone.isEmpty { store.recorder?.requestReset() } // watchers re-read (docs/watch.md)
                    return (undone, try Bookkeeping.userVersion(db))
                }
            } catch {
                throw StoreError.from(error, user: user)
            }
        }
    }

    /// Takes a consistent copy of `user`'s store (to `path`, or into the backups folder) and
    /// returns its path.
    public func backup(_ user: UserID, to path: String? = nil) async throws -> String {
        let keeper = BackupKeeper(layout: configuration.layout)
        let (copy, version) = try await withStore(user, access: .admin) { store in
            try await store.write { db in
                let version = try Bookkeeping.userVersion(db)
                return (try keeper.take(db, user: user, schemaVersion: version, reason: .manual, to: path), version)
            }
        }
        observer.record(.backupCreated(user: user, path: copy, schemaVersion: version, reason: .manual))
        return copy
    }

    /// Records the current files' checksums for `user`'s applied migrations (all, or only
    /// `versions`) after an operator accepted a changed file. Returns the versions updated.
    public func acceptChecksums(_ user: UserID, versions: Set<Int64>? = nil) async throws -> [Int64] {
        let accepted = try await withStore(user, access: .admin) { store in
            let migrator = preparer.makeMigrator(user, migrations: migrations)
            return try await store.write { db in try migrator.acceptChecksums(db, versions: versions) }
        }
        setPhase(user, ready: false, stale: true)
        return accepted
    }

    /// Checks `user`'s store: SQLite's integrity and foreign keys, the bookkeeping against the
    /// schema, and the applied migrations against the files.
    public func verify(_ user: UserID) async throws -> VerificationReport {
        let migrations = self.migrations
        return try await withStore(user, access: .admin) { store in
            try await store.read { db in try StoreVerifier(user: user, migrations: migrations).verify(db) }
        }
    }
}
