/// Everything that can go wrong with one user's store. Each case carries what a caller needs to
/// act on it, and maps one-to-one onto a named varlink error in the daemon.
public enum StoreError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The user ID is not valid; nothing was created.
    case invalidUser(id: String, reason: String)
    /// Migration `version` (`migration` is its file) failed; the store was rolled back to
    /// `schemaVersion`. `message` is SQLite's message (or the foreign key check's finding).
    case migrationFailed(user: UserID, version: Int64, migration: String, message: String, sqliteCode: Int32?, schemaVersion: Int64)
    /// The store's schema is newer than every migration the daemon knows; it was not touched.
    case storeTooNew(user: UserID, storeVersion: Int64, knownVersion: Int64)
    /// An applied migration's file changed after it was applied.
    case checksumMismatch(user: UserID, version: Int64, migration: String, recorded: String, current: String)
    /// A migration numbered below the store's latest applied one was never applied to it, and
    /// out-of-order migrations are not allowed.
    case outOfOrderMigration(user: UserID, version: Int64, migration: String, latestApplied: Int64)
    /// The file is not a SQLite database, is corrupt, or its bookkeeping is inconsistent.
    case storeDamaged(user: UserID, message: String)
    /// A rollback needs a Down section that the migration does not have.
    case irreversibleMigration(user: UserID, version: Int64, migration: String)
    /// A statement failed; `code` is SQLite's extended result code.
    case sqlError(code: Int32, message: String, sql: String?)
    /// The store's file could not be created or opened (permissions, disk full, ...).
    case storageFailure(user: UserID, message: String)
    /// The user has no store (for operations that never create one).
    case noSuchStore(user: UserID)
    /// The user has no backup of that name.
    case noSuchBackup(user: UserID, backup: String)
    /// An import was refused (not SQLite, damaged, version unknown, store exists); nothing changed.
    case importRefused(user: UserID, reason: String)
    /// The replica could not be reached, or did not confirm a durable write: the store is not
    /// restored (nothing was created) or the write, committed locally, is not known to be in
    /// the replica.
    case replicationUnavailable(user: UserID, message: String)
    /// The replica's copy of the store cannot be restored (it fails its integrity check or
    /// cannot be decoded); nothing local was created or replaced.
    case replicaDamaged(user: UserID, message: String)
    /// With more than one host (`cluster.*`): another host owns the user's bucket; ask it at
    /// `address`. `epoch` is the bucket record's epoch this host saw.
    case wrongHost(user: UserID, host: String, address: String, epoch: Int64)
    /// With more than one host: this host cannot tell now that it may serve the user (no owner
    /// record seen yet, or its etcd lease is not confirmed); nothing was done. Retry.
    case clusterUnavailable(user: UserID, message: String)
    /// With more than one host: the user's bucket is moving to another host (its stores are
    /// being synced and closed here); nothing was done. Retry shortly: the new owner serves it.
    case retry(user: UserID, reason: String)
    /// Encryption is on (`encryption.*`) and the store is encrypted, but the key store holds no
    /// usable data key of the user (none, or a record that does not open): the store is not
    /// read, never served empty. Restore the key store's record (docs/encryption.md).
    case storeKeyMissing(user: UserID, message: String)
    /// The user's data key was destroyed (DeleteStore erases by key): this copy of the store
    /// can never be read again.
    case storeErased(user: UserID)

    public var description: String {
        switch self {
        case .invalidUser(let id, let reason):
            return "invalid user ID \(id.debugDescription): \(reason)"
        case .migrationFailed(let user, let version, let migration, let message, _, let schemaVersion):
            return "store '\(user)': migration \(version) (\(migration)) failed: \(message); the store stays at version \(schemaVersion)"
        case .storeTooNew(let user, let storeVersion, let knownVersion):
            return "store '\(user)' is at schema version \(storeVersion), newer than the latest known migration \(knownVersion); it was left untouched"
        case .checksumMismatch(let user, let version, let migration, let recorded, let current):
            return "store '\(user)': migration \(version) (\(migration)) changed after it was applied (recorded checksum \(recorded.prefix(12)), file now \(current.prefix(12))); restore the file or accept the change"
        case .outOfOrderMigration(let user, let version, let migration, let latestApplied):
            return "store '\(user)': migration \(version) (\(migration)) is numbered below the latest applied migration \(latestApplied) but was never applied; renumber it or allow out-of-order migrations"
        case .storeDamaged(let user, let message):
            return "store '\(user)' is damaged: \(message)"
        case .irreversibleMigration(let user, let version, let migration):
            return "store '\(user)': migration \(version) (\(migration)) has no Down section; cannot roll back past it"
        case .sqlError(let code, let message, _):
            return "SQL error \(code): \(message)"
        case .storageFailure(let user, let message):
            return "store '\(user)': cannot open or create the file: \(message)"
        case .noSuchStore(let user):
            return "user '\(user)' has no store"
        case .noSuchBackup(let user, let backup):
            return "user '\(user)' has no backup '\(backup)'"
        case .importRefused(let user, let reason):
            return "import into store '\(user)' refused: \(reason)"
        case .replicationUnavailable(let user, let message):
            return "store '\(user)': replication unavailable: \(message)"
        case .replicaDamaged(let user, let message):
            return "store '\(user)': the replica's copy cannot be restored: \(message)"
        case .wrongHost(let user, let host, let address, let epoch):
            return "store '\(user)' is served by host \(host) (\(address)), bucket epoch \(epoch)"
        case .clusterUnavailable(let user, let message):
            return "store '\(user)': the cluster cannot confirm this host serves it: \(message)"
        case .retry(let user, let reason):
            return "store '\(user)': retry: \(reason)"
        case .storeKeyMissing(let user, let message):
            return "store '\(user)' is encrypted and its data key is missing: \(message)"
        case .storeErased(let user):
            return "store '\(user)' was erased: its data key is destroyed, and this copy can no longer be read"
        }
    }
}
