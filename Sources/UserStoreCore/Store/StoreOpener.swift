import Foundation
import GRDB
import GRDBSQLite

/// Opens (or creates) a store's file with the connection settings every store uses.
struct StoreOpener: Sendable {
    let layout: StoreLayout
    /// How long a statement waits for another process's lock before failing with SQLITE_BUSY.
    let busyTimeoutSeconds: Double
    /// The stores are replicated (a registry with a ``StoreReplication``): a ``WALHook`` on each
    /// captures every commit and replaces SQLite's automatic checkpoints.
    var replicated = false
    /// Stores record their committed changes for watchers (nil: they do not).
    var changeRetention: ChangeRetention?
    /// Encrypts the stores with their users' data keys (nil: stores are plaintext).
    var keyring: StoreKeyring?

    /// Opens `user`'s file with `cipher` (``cipher(for:create:)``, fetched before: nil for a
    /// plaintext store); creates it (and its folders) when absent, as a copy of `template`
    /// when one is given — or, without `create`, throws ``StoreError/noSuchStore(user:)``.
    /// Nothing is written to an existing file here: journal mode and bookkeeping are only
    /// touched when migrating.
    func open(_ user: UserID, template: StoreTemplate? = nil, create: Bool = true, cipher: PageCipher? = nil) throws -> (store: Store, created: Bool) {
        let path = layout.storePath(for: user)
        let created = !FileManager.default.fileExists(atPath: path)
        if created && !create { throw StoreError.noSuchStore(user: user) }
        // One read of the header: damage, and whether the file is encrypted.
        let inspected = created ? (damage: nil, encrypted: false) : StoreFileInspector.inspect(path)
        if let damage = inspected.damage {
            throw StoreError.storeDamaged(user: user, message: damage)
        }
        if keyring == nil, inspected.encrypted {
            throw StoreError.storeKeyMissing(user: user, message: "the store is encrypted and this configuration has no encryption section")
        }
        if created {
            do {
                try FileManager.default.createDirectory(atPath: layout.storeDirectory(for: user), withIntermediateDirectories: true)
            } catch {
                throw StoreError.storageFailure(user: user, message: (error as NSError).localizedDescription)
            }
        }
        // The key was in the key store before anything is written with it.
        if keyring != nil, cipher == nil {
            throw StoreError.storageFailure(user: user, message: "the store's data key was not fetched before it was opened")
        }
        if created {
            precondition(cipher == nil || template == nil, "an encrypted store is not made from the plaintext template")
            try template?.install(at: path, user: user)
        }
        let guardian = StoreGuard()
        let replicated = self.replicated
        let recorder = changeRetention.map { ChangeRecorder(guardian: guardian, retention: $0) }
        let wal = WALHook()
        var configuration = Configuration()
        configuration.label = "userstore.\(user.rawValue)"
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(busyTimeoutSeconds)
        configuration.journalMode = .default
        // An interactive transaction spans several blocks of the store's queue (Store).
        configuration.allowsUnsafeTransactions = true
        configuration.prepareDatabase { db in
            // Before anything of the file is read past its header.
            try cipher?.install(on: db.sqliteConnection!)
            // The daemon is the only process that opens its stores (the data directory's lock),
            // and each through one connection: the file lock is taken once and kept (no lock
            // and unlock system calls per statement), and WAL's index lives in the connection's
            // memory instead of a -shm file (one file descriptor fewer per open store). Must be
            // set before the first read of the file. A replicated store too: the host log reads
            // its WAL's bytes (WALCapture), not through SQLite, and takes no lock. (Litestream,
            // until 2026-11-28, read it through a connection of its own, so replicated stores
            // kept normal locking: ~5 fcntl calls per durable write.)
            try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE")
            // Durability of every committed transaction (WAL's default NORMAL can lose the last ones on power loss).
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // Replaces GRDB's own authorizer, which only feeds features userstore does not use
            // (transaction observers, region tracking); see StoreGuard.
            guardian.install(on: db.sqliteConnection!)
            // GRDB's commit and rollback hooks feed its transaction observers (unused here) and
            // expect to run on GRDB's own queue; client statements also run on the caller's
            // thread (Store.runIfIdle), where they would trap.
            sqlite3_commit_hook(db.sqliteConnection!, nil, nil)
            sqlite3_rollback_hook(db.sqliteConnection!, nil, nil)
            // The change stream's recorder takes the commit and rollback hooks instead.
            recorder?.install(on: db.sqliteConnection!)
            if replicated { wal.install(on: db.sqliteConnection!) }
        }
        do {
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            return (Store(user: user, path: path, queue: queue, guardian: guardian, wal: wal, recorder: recorder), created)
        } catch let error as DatabaseError {
            if error.extendedResultCode == .SQLITE_IOERR_DATA { throw StoreError.storeDamaged(user: user, message: PageCipher.unauthenticPage) }
            switch error.resultCode {
            case .SQLITE_NOTADB, .SQLITE_CORRUPT:
                throw StoreError.storeDamaged(user: user, message: error.message ?? "not a database")
            default:
                throw StoreError.storageFailure(user: user, message: error.message ?? "\(error.resultCode)")
            }
        }
    }

    /// The cipher `user`'s store is to be opened with: nil without encryption, and when the
    /// store is missing and not to be created or damaged (``open(_:template:create:cipher:)``
    /// names those). Fetched from the key store before the job that opens the store, with no
    /// thread waiting for it; a new store's key is stored durably before this returns, a
    /// plaintext store (made before encryption was on, imported, restored from a plaintext
    /// copy) is encrypted first, and a rotation a crash cut short is finished.
    func cipher(for user: UserID, create: Bool) async throws(StoreError) -> PageCipher? {
        guard let keyring else { return nil }
        let path = layout.storePath(for: user)
        enum Found { case missing, empty, damaged, encrypted, plaintext }
        let found = await BlockingPool.run { () -> Found in
            guard FileManager.default.fileExists(atPath: path) else { return .missing }
            if (FileHead.size(of: path) ?? 0) == 0 { return .empty }
            let inspected = StoreFileInspector.inspect(path)
            if inspected.damage != nil { return .damaged }
            return inspected.encrypted ? .encrypted : .plaintext
        }
        if found == .damaged || (found == .missing && !create) { return nil }
        guard PageCipher.layerRegistered else {
            throw .storageFailure(user: user, message: "the encrypting VFS layer is not SQLite's default (SQLite was set up before SQLiteProcessSettings.apply())")
        }
        switch found {
        case .damaged:
            return nil
        case .missing, .empty:
            return try await keyring.cipher(for: user, create: true)
        case .encrypted:
            let keys = try await keyring.ciphers(for: user)
            // A rotation a crash cut short after the store was rewritten with the next key.
            guard let next = keys.next, await BlockingPool.run({ !keys.current.opensFirstPage(of: path) && next.opensFirstPage(of: path) }) else {
                return keys.current
            }
            try await keyring.finishRotation(of: user)
            return next
        case .plaintext:
            let cipher = try await keyring.cipher(for: user, create: true)
            do {
                try await BlockingPool.run { try StoreEncryptor.encrypt(path, with: cipher) }
            } catch {
                throw .storageFailure(user: user, message: "the plaintext store could not be encrypted: \(error)")
            }
            return cipher
        }
    }
}
