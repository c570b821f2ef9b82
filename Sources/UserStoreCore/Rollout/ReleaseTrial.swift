import CSQLiteSettings
import Foundation
import GRDB
import GRDBSQLite

/// What running the loaded migrations on a copy of one store did (`release trial`).
public struct TrialOutcome: Sendable {
    public var user: UserID
    /// The error of the migration that failed on the copy (or of the copy itself); nil: it ran.
    public var error: StoreError?
    /// The migration run's wall time on the copy (the copy itself not included).
    public var milliseconds: Double
    /// The copy's size (page count × page size) before and after the run.
    public var bytesBefore: Int64
    public var bytesAfter: Int64
    public var fromVersion: Int64
    public var toVersion: Int64
    /// Versions the run applied (empty: the store is already at the loaded versions).
    public var applied: [Int64]

    public var ok: Bool { error == nil }
}

/// Runs the loaded migrations on consistent copies of live stores, in the staging folder, to
/// see what a release will do to real data before it touches any (docs/releases.md). Nothing
/// live changes:
/// - a store the registry has open is copied through its connection (held only for the copy);
/// - any other store is copied through a private connection that holds the file for the copy
///   only (a request that opens it meanwhile waits for it, as for any lock), leaves its WAL as
///   it found it, and takes no place among the open stores — no `maxOpenStores` slot, no
///   eviction;
/// - the copy is migrated by a migrator that takes no backup, reports no event and is not
///   gated by the release, then deleted.
public struct ReleaseTrial: Sendable {
    let registry: StoreRegistry

    /// Copies `user`'s store and migrates the copy; never throws (a failure is the outcome).
    public func run(_ user: UserID) async -> TrialOutcome {
        var outcome = TrialOutcome(user: user, error: nil, milliseconds: 0, bytesBefore: 0, bytesAfter: 0, fromVersion: 0, toVersion: 0, applied: [])
        let files = StoreFiles(layout: registry.configuration.layout)
        let copy: String
        do {
            copy = try files.stagingPath(for: user)
        } catch {
            outcome.error = .storageFailure(user: user, message: "staging folder: \(error)")
            return outcome
        }
        defer { for suffix in ["", "-wal", "-shm", "-journal"] { unlink(copy + suffix) } }
        do {
            try await self.copy(user, to: copy)
        } catch {
            outcome.error = StoreError.from(error, user: user)
            return outcome
        }
        let migrator = registry.preparer.makeMigrator(user, migrations: registry.migrations, simulating: true)
        let initial = outcome
        do {
            // An encrypted store's copy is encrypted with its key.
            let cipher = try await StoreKeyring.cipher(ifEncrypted: copy, user: user, keyring: registry.configuration.keyring)
            return try await BlockingPool.run {
                var outcome = initial
                var configuration = Configuration()
                configuration.prepareDatabase { db in try StoreKeyring.install(cipher, on: db.sqliteConnection!, user: user) }
                let queue = try DatabaseQueue(path: copy, configuration: configuration)
                defer { try? queue.close() }
                try queue.writeWithoutTransaction { db in
                    outcome.bytesBefore = try Self.size(db)
                    outcome.fromVersion = try Bookkeeping.userVersion(db)
                    outcome.toVersion = outcome.fromVersion
                    let started = DispatchTime.now()
                    do {
                        let report = try migrator.migrate(db, created: false)
                        outcome.toVersion = report.toVersion
                        outcome.applied = report.applied
                    } catch {
                        outcome.error = StoreError.from(error, user: user)
                    }
                    outcome.milliseconds = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e6
                    outcome.bytesAfter = try Self.size(db)
                }
                return outcome
            }
        } catch {
            outcome.error = StoreError.from(error, user: user)
            return outcome
        }
    }

    /// A consistent copy of `user`'s live store at `path` (``StoreError/noSuchStore(user:)``
    /// when there is none).
    private func copy(_ user: UserID, to path: String) async throws {
        if try await copyOpenStore(user, to: path) { return }
        // Being closed (idle, evicted): its connection holds the file until then.
        await registry.waitForClose(of: user)
        let live = registry.configuration.layout.storePath(for: user)
        guard FileManager.default.fileExists(atPath: live) else { throw StoreError.noSuchStore(user: user) }
        let cipher = try await StoreKeyring.cipher(ifEncrypted: live, user: user, keyring: registry.configuration.keyring)
        let copied = try await BlockingPool.run { try Self.copyClosedStore(live, to: path, user: user, cipher: cipher) }
        // Opened by the registry meanwhile: copy through its connection.
        if !copied, try await !copyOpenStore(user, to: path) {
            throw StoreError.storageFailure(user: user, message: "the store is busy: try again")
        }
    }

    /// Copies through the registry's connection when it has the store open; false when it has not.
    private func copyOpenStore(_ user: UserID, to path: String) async throws -> Bool {
        guard let store = registry.leaseIfOpen(user) else { return false }
        defer { registry.release(user) }
        try await store.write { db in try BackupKeeper.copy(db.sqliteConnection!, to: path) }
        return true
    }

    /// Copies a store nobody has open through a private connection that locks it exclusively
    /// for the copy and leaves its WAL (a replicated store keeps one for Litestream) untouched.
    /// False when the file is locked (the registry has just opened it). `cipher`: the store's
    /// (nil: plaintext).
    private static func copyClosedStore(_ live: String, to path: String, user: UserID, cipher: PageCipher?) throws -> Bool {
        let hadWAL = FileManager.default.fileExists(atPath: live + "-wal")
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(live, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            throw StoreError.storeDamaged(user: user, message: "cannot be opened for a copy")
        }
        if hadWAL { _ = userstore_keep_wal_on_close(connection) }
        try StoreKeyring.install(cipher, on: connection, user: user)
        let locked = sqlite3_exec(connection, "PRAGMA locking_mode = EXCLUSIVE; SELECT count(*) FROM sqlite_master", nil, nil, nil)
        if locked == SQLITE_BUSY || locked == SQLITE_LOCKED { return false }
        guard locked == SQLITE_OK else {
            throw StoreError.storeDamaged(user: user, message: String(cString: sqlite3_errmsg(connection)))
        }
        try BackupKeeper.copy(connection, to: path)
        return true
    }

    private static func size(_ db: Database) throws -> Int64 {
        (try Int64.fetchOne(db, sql: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")) ?? 0
    }
}

extension StoreRegistry {
    /// Trial runs of the loaded migrations on copies of live stores.
    public var trial: ReleaseTrial { ReleaseTrial(registry: self) }

    /// `user`'s store, leased, when the registry has it open in any state but being prepared
    /// (a trial copies it through that connection); nil without opening anything.
    func leaseIfOpen(_ user: UserID) -> Store? {
        state.withLock { state in
            guard let index = state.entries.index(forKey: user), let store = state.entries.values[index].store else { return nil }
            if case .preparing = state.entries.values[index].phase { return nil }
            state.tick += 1
            state.entries.values[index].lease(tick: state.tick)
            return store
        }
    }
}
