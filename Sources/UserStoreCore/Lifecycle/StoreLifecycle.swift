import Foundation
import GRDB
import GRDBSQLite

/// A store's whole life beyond requests: delete, import, export snapshots, backups and restore.
/// Each operation that replaces or removes the files runs with the store closed
/// (``StoreRegistry/withStoreClosed(_:replacingFiles:_:)``); requests for that user wait and are
/// answered after it, never in the middle.
public struct StoreLifecycle: Sendable {
    let registry: StoreRegistry

    // MARK: Delete

    /// Removes `user`'s store, its WAL, and every backup of it unless `keepBackups`. A later
    /// request for the user starts a new, empty store.
    public func delete(_ user: UserID, keepBackups: Bool) async throws -> DeletionReport {
        let files = StoreFiles(layout: registry.configuration.layout)
        let replication = registry.replication, path = registry.configuration.layout.storePath(for: user)
        let keyring = registry.configuration.keyring
        let report = try await registry.withStoreClosed(user, replacingFiles: true) {
            // The key first (erase by key): every copy made before — a backup, the bucket, an
            // older version of an object — is unreadable from then on, whatever happens next.
            var keyDestroyed = false
            if let keyring, try await keyring.hasKey(user) {
                try await keyring.destroy(user)
                keyDestroyed = true
            }
            // The replica next: one that cannot be deleted refuses the whole deletion, rather
            // than leave a copy the next request would restore.
            do {
                try await replication?.storeErased(user, path: path)
            } catch StoreError.replicationUnavailable(let user, let message) where keyDestroyed {
                // Refused, but not undone: the user's data is unreadable from here on.
                throw StoreError.replicationUnavailable(user: user, message: message + " (its data key is destroyed already: no copy of the store can be read — StoreErased —, and the retry removes them)")
            }
            return try await BlockingPool.run { try files.delete(user, keepBackups: keepBackups) }
        }
        if report.existed || !report.removedFiles.isEmpty {
            registry.observer.record(.storeDeleted(user: user, removedFiles: report.removedFiles.count, keptBackups: keepBackups))
        }
        return report
    }

    // MARK: Key rotation

    /// Re-encrypts `user`'s store under a new data key (docs/encryption.md, "Rotation"), with the
    /// store closed: the next key stored beside the current one, the store checkpointed and
    /// rewritten page by page with the next key, then the next key made the only one. A crash
    /// in between leaves both keys in the key store, and the store is opened with whichever
    /// reads it. A plaintext store is encrypted. Returns the pages rewritten. Throws
    /// ``StoreError/noSuchStore(user:)``.
    public func rotateKey(_ user: UserID, keyring: StoreKeyring) async throws -> Int {
        let path = registry.configuration.layout.storePath(for: user)
        return try await replacingFiles(of: user) { () async throws -> Int in
            guard FileManager.default.fileExists(atPath: path) else { throw StoreError.noSuchStore(user: user) }
            let pages: Int
            do {
                if !StoreFileInspector.isEncrypted(path) {
                    try StoreEncryptor.encrypt(path, with: try await keyring.cipher(for: user, create: true))
                    let header = FileHead(path: path, count: 18)?.bytes ?? []
                    let raw = header.count == 18 ? Int(header[16]) << 8 | Int(header[17]) : 4096
                    pages = Int((FileHead.size(of: path) ?? 0) / UInt64(raw == 1 ? 65_536 : max(raw, 512)))
                } else {
                    var (current, next) = try await keyring.beginRotation(of: user)
                    if !current.opensFirstPage(of: path), next.opensFirstPage(of: path) {
                        // A rotation a crash cut short after the rewrite: finished, then a new one.
                        try await keyring.finishRotation(of: user)
                        (current, next) = try await keyring.beginRotation(of: user)
                    }
                    try Self.checkpoint(path, user: user, cipher: current)
                    pages = try StoreEncryptor.reencrypt(path, from: current, to: next)
                    try await keyring.finishRotation(of: user)
                }
            } catch let error as StoreEncryptor.Failure {
                throw StoreError.storageFailure(user: user, message: "rotating the store's key: \(error)")
            }
            // A change the replication did not see: the next open ships the store whole.
            self.registry.replication?.storeReplaced(user, path: path)
            return pages
        }
    }

    /// Copies everything the WAL of the closed store at `path` holds into its file and empties it.
    private static func checkpoint(_ path: String, user: UserID, cipher: PageCipher) throws {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            throw StoreError.storeDamaged(user: user, message: "cannot be opened to checkpoint it")
        }
        try cipher.install(on: connection)
        guard sqlite3_exec(connection, "PRAGMA locking_mode = EXCLUSIVE; PRAGMA wal_checkpoint(TRUNCATE)", nil, nil, nil) == SQLITE_OK else {
            let message = String(cString: sqlite3_errmsg(connection))
            if sqlite3_extended_errcode(connection) == ResultCode.SQLITE_IOERR_DATA.rawValue { throw StoreError.storeDamaged(user: user, message: PageCipher.unauthenticPage) }
            throw StoreError.storageFailure(user: user, message: "checkpointing before the key rotation: \(message)")
        }
    }

    /// Finishes deletions a crash interrupted and clears half-prepared imports and restores.
    /// Call before serving.
    public func recoverInterruptedOperations() throws -> [UserID] {
        try StoreFiles(layout: registry.configuration.layout).recoverInterruptedOperations()
    }

    // MARK: Import

    /// Makes the SQLite file `source` `user`'s store (see ``StoreImporter``). Refused when the
    /// user has a store, unless `replace` (the old one is copied first).
    public func importStore(_ user: UserID, from source: ImportSource, schemaVersion requested: Int64?, replace: Bool) async throws -> ImportReport {
        let started = ContinuousClock.now
        let files = StoreFiles(layout: registry.configuration.layout)
        let importer = StoreImporter(user: user, migrations: registry.migrations, appVersion: registry.configuration.appVersion)
        let staged = try files.stagingPath(for: user)
        defer { for suffix in ["", "-wal", "-shm"] { unlink(staged + suffix) } }
        let prepared = try await BlockingPool.run {
            try importer.copy(source, to: staged)
            return try importer.prepare(staged, requested: requested)
        }
        let layout = registry.configuration.layout
        let report = try await replacingFiles(of: user) { () async throws -> ImportReport in
            let exists = FileManager.default.fileExists(atPath: layout.storePath(for: user))
            if exists && !replace { throw importer.refused("the user already has a store; to replace it (a copy of it is kept), set replace in ImportStore, or --replace with userstorectl import") }
            let backup = exists ? try await Self.backUpClosedStore(user, layout: layout, reason: .beforeImport, observer: self.registry.observer,
                                                                        keyring: self.registry.configuration.keyring) : nil
            try await self.carryChangePositions(user, into: staged)
            try await self.encryptStaged(staged, user: user)
            try files.publish(staged, as: user)
            self.registry.replication?.storeReplaced(user, path: layout.storePath(for: user))
            return ImportReport(schemaVersion: prepared.schemaVersion, keptBookkeeping: prepared.keptBookkeeping, replaced: exists, backup: backup)
        }
        registry.observer.record(.storeImported(user: user, schemaVersion: report.schemaVersion, replaced: report.replaced,
                                       durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds))
        return report
    }

    // MARK: Backups and restore

    /// Every backup of `user`, oldest first.
    public func backups(of user: UserID) -> [BackupInfo] {
        BackupKeeper(layout: registry.configuration.layout).backups(of: user)
    }

    /// Replaces `user`'s store with its backup `name` (a file name or path from
    /// ``backups(of:)``); the live store, if any, is copied first. The next request migrates
    /// the restored store as usual. Returns the backup restored and the live store's copy.
    public func restore(_ user: UserID, backup name: String) async throws -> (restored: BackupInfo, previous: String?) {
        let started = ContinuousClock.now
        guard let backup = backups(of: user).first(where: { $0.fileName == name || $0.path == name }) else {
            throw StoreError.noSuchBackup(user: user, backup: name)
        }
        let files = StoreFiles(layout: registry.configuration.layout)
        let staged = try files.stagingPath(for: user)
        defer { for suffix in ["", "-wal", "-shm"] { unlink(staged + suffix) } }
        try await BlockingPool.run { try FileManager.default.copyItem(atPath: backup.path, toPath: staged) }
        try await Self.checkIntegrity(staged, user: user, what: "backup \(backup.fileName)", keyring: registry.configuration.keyring)
        let previous = try await replaceClosedStore(user, with: staged)
        registry.observer.record(.storeRestored(user: user, source: backup.fileName, schemaVersion: backup.schemaVersion,
                                       durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds))
        return (backup, previous)
    }

    /// Replaces `user`'s store with the replica's copy — its latest state, or its state at
    /// `timestamp` — like a restore from a backup: the copy is restored into the staging folder
    /// and integrity-checked first, the live store (if any) is copied to its backups, and the
    /// next request migrates the restored store as usual. A replica that has nothing, cannot be
    /// reached or is damaged leaves the live store as it was. Returns the replica restore and
    /// the live store's copy.
    public func restoreFromReplica(_ user: UserID, timestamp: Date?) async throws -> (restored: ReplicaRestore, previous: String?) {
        guard let replication = registry.replication else {
            throw StoreError.replicationUnavailable(user: user, message: "replication is off (no replication section in the configuration)")
        }
        let files = StoreFiles(layout: registry.configuration.layout)
        let staged = try files.stagingPath(for: user)
        defer { for suffix in ["", "-wal", "-shm"] { unlink(staged + suffix) } }
        guard let restored = try await replication.restore(user, to: staged, timestamp: timestamp) else {
            throw StoreError.replicationUnavailable(user: user, message: "the replica holds no copy of this store"
                                                    + (timestamp.map { " at \($0.formatted(.iso8601))" } ?? ""))
        }
        try await Self.checkIntegrity(staged, user: user, what: "the replica's copy", keyring: registry.configuration.keyring)
        let previous = try await replaceClosedStore(user, with: staged)
        registry.observer.record(.storeRestored(user: user, source: restored.source, schemaVersion: restored.schemaVersion,
                                       durationMicroseconds: restored.durationMicroseconds))
        return (restored, previous)
    }

    /// A restore's last step, with the store closed: the live store (if any) copied to its
    /// backups (`before-restore`), `staged` published as the store, the replicator told.
    /// Returns the live store's copy.
    private func replaceClosedStore(_ user: UserID, with staged: String) async throws -> String? {
        let layout = registry.configuration.layout, files = StoreFiles(layout: layout)
        return try await replacingFiles(of: user) { () async throws -> String? in
            let exists = FileManager.default.fileExists(atPath: layout.storePath(for: user))
            let copy = exists ? try await Self.backUpClosedStore(user, layout: layout, reason: .beforeRestore, observer: self.registry.observer,
                                                                      keyring: self.registry.configuration.keyring) : nil
            try await self.carryChangePositions(user, into: staged)
            try await self.encryptStaged(staged, user: user)
            try files.publish(staged, as: user)
            self.registry.replication?.storeReplaced(user, path: layout.storePath(for: user))
            return copy
        }
    }

    /// Runs `work`, which replaces `user`'s store files, with the store closed
    /// (``StoreRegistry/withStoreClosed(_:replacingFiles:_:)``) and the blocking pool as its
    /// executor: its file work runs on the pool's threads, its waits for the key store on none.
    private func replacingFiles<T: Sendable>(of user: UserID, _ work: @escaping @Sendable () async throws -> T) async throws -> T {
        try await registry.withStoreClosed(user, replacingFiles: true) { try await BlockingPool.executing { try await work() } }
    }

    /// With encryption on, a plaintext file about to become `user`'s store (an import, a
    /// plaintext backup or copy) is encrypted first, so that it is never in place in plaintext.
    private func encryptStaged(_ staged: String, user: UserID) async throws {
        guard let keyring = registry.configuration.keyring, await !BlockingPool.run({ StoreFileInspector.isEncrypted(staged) }) else { return }
        let cipher = try await keyring.cipher(for: user, create: true)
        do {
            try await BlockingPool.run { try StoreEncryptor.encrypt(staged, with: cipher) }
        } catch let error as StoreEncryptor.Failure {
            throw StoreError.storageFailure(user: user, message: "encrypting the new store: \(error)")
        }
    }

    /// With the change stream on: the replacing file goes on from the live store's position,
    /// with a reset (docs/watch.md, "Resuming"), so positions never repeat across a replacement.
    private func carryChangePositions(_ user: UserID, into staged: String) async throws {
        guard registry.configuration.changeRetention != nil else { return }
        let current = registry.configuration.layout.storePath(for: user)
        let keyring = registry.configuration.keyring
        let ciphers = (current: try await StoreKeyring.cipher(ifEncrypted: current, user: user, keyring: keyring),
                       staged: try await StoreKeyring.cipher(ifEncrypted: staged, user: user, keyring: keyring))
        do {
            try await BlockingPool.run { () throws(ChangeLogError) in try ChangeLog.continuePositions(from: current, into: staged, ciphers: ciphers) }
        } catch {
            throw StoreError.storageFailure(user: user, message: "the change log's position could not be carried over: \(error.message)")
        }
    }

    /// A consistent copy of `user`'s store as it is (not migrated first) at `path`, taken on its
    /// queue; returns its schema version. Throws ``StoreError/noSuchStore(user:)``. The copy of
    /// an encrypted store is encrypted too, unless `plaintext` (an export: data portability).
    public func snapshot(_ user: UserID, to path: String, plaintext: Bool = false) async throws -> Int64 {
        try await registry.withExistingStore(user) { store in
            try await store.write { db in
                do {
                    try BackupKeeper.copy(db.sqliteConnection!, to: path, plaintext: plaintext)
                } catch {
                    throw StoreError.storageFailure(user: user, message: "copying the store: \(error)")
                }
                return try Bookkeeping.userVersion(db)
            }
        }
    }

    /// Copies a closed store (before it is replaced) into its backups folder. A file SQLite
    /// cannot read (or whose key cannot be had) is copied byte for byte, so that even a damaged
    /// store is kept.
    private static func backUpClosedStore(_ user: UserID, layout: StoreLayout, reason: BackupReason, observer: any StoreObserver,
                                          keyring: StoreKeyring?) async throws -> String {
        let path = layout.storePath(for: user)
        // Double optional: nil when the key cannot be had; .some(nil) for a plaintext store.
        let cipher = try? await StoreKeyring.cipher(ifEncrypted: path, user: user, keyring: keyring)
        return try await BlockingPool.run { try backUpClosedStore(user, layout: layout, reason: reason, observer: observer, cipher: cipher) }
    }

    private static func backUpClosedStore(_ user: UserID, layout: StoreLayout, reason: BackupReason, observer: any StoreObserver,
                                          cipher: PageCipher??) throws -> String {
        let path = layout.storePath(for: user)
        let keeper = BackupKeeper(layout: layout)
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        if let cipher, sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection,
           (try? StoreKeyring.install(cipher, on: connection, user: user)) != nil,
           sqlite3_exec(connection, "PRAGMA locking_mode = EXCLUSIVE; SELECT count(*) FROM sqlite_master", nil, nil, nil) == SQLITE_OK {
            var version: Int64 = 0
            var statement: OpaquePointer?
            if sqlite3_prepare_v2(connection, "PRAGMA user_version", -1, &statement, nil) == SQLITE_OK, sqlite3_step(statement) == SQLITE_ROW {
                version = sqlite3_column_int64(statement, 0)
            }
            sqlite3_finalize(statement)
            let copy = try keeper.take(connection, user: user, schemaVersion: version, reason: reason)
            observer.record(.backupCreated(user: user, path: copy, schemaVersion: version, reason: reason))
            return copy
        }
        let directory = layout.backupDirectory(for: user)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let target = directory + "/" + BackupKeeper.fileName(user: user, schemaVersion: -1, reason: reason, at: Date())
        try FileManager.default.copyItem(atPath: path, toPath: target + BackupKeeper.partialSuffix)
        try DurableFile.publish(target + BackupKeeper.partialSuffix, as: target)
        observer.record(.backupCreated(user: user, path: target, schemaVersion: -1, reason: reason))
        return target
    }

    /// Refuses a file SQLite cannot open (or whose key cannot be had) or whose
    /// `integrity_check` fails; the check runs on the blocking pool.
    static func checkIntegrity(_ path: String, user: UserID, what: String, keyring: StoreKeyring? = nil) async throws {
        let cipher = try await StoreKeyring.cipher(ifEncrypted: path, user: user, keyring: keyring)
        try await BlockingPool.run { try checkIntegrity(path, user: user, what: what, cipher: cipher) }
    }

    private static func checkIntegrity(_ path: String, user: UserID, what: String, cipher: PageCipher?) throws {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            throw StoreError.storeDamaged(user: user, message: "\(what) cannot be opened")
        }
        try StoreKeyring.install(cipher, on: connection, user: user)
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        var finding = "cannot be read"
        if sqlite3_prepare_v2(connection, "PRAGMA integrity_check", -1, &statement, nil) == SQLITE_OK {
            if sqlite3_step(statement) == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) {
                finding = String(cString: text)
            } else {
                finding = String(cString: sqlite3_errmsg(connection))
            }
        } else {
            finding = String(cString: sqlite3_errmsg(connection))
        }
        guard finding == "ok" else { throw StoreError.storeDamaged(user: user, message: "\(what) fails integrity_check: \(finding)") }
    }
}

extension StoreRegistry {
    /// Delete, import, snapshot, backups and restore of whole stores.
    public var lifecycle: StoreLifecycle { StoreLifecycle(registry: self) }
}
