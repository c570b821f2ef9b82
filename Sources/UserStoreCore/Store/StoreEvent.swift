/// Something that happened to a store, reported to a ``StoreObserver`` as it happens.
/// The journal and the CLI's progress display are built on these. Events never carry SQL
/// parameters or row contents.
public enum StoreEvent: Sendable, Equatable {
    /// A new store file was created; `templateVersion` is the schema version of the template it
    /// was copied from, nil when it starts empty and is migrated step by step.
    case storeCreated(user: UserID, path: String, templateVersion: Int64? = nil)
    /// A migration run starts: `steps` migrations take the store from `from` to `to`; `backup`
    /// says whether the store was copied first and why (nil for a new store).
    case migrationStarted(user: UserID, from: Int64, to: Int64, steps: Int, backup: BackupDecision? = nil)
    /// Step `step` of `steps` finished. `skipped` when app-version gating skipped its SQL.
    case migrationStep(user: UserID, version: Int64, migration: String, step: Int, steps: Int, durationMicroseconds: Int64, skipped: Bool)
    /// Every step of the run committed.
    case migrationFinished(user: UserID, from: Int64, to: Int64, steps: Int, durationMicroseconds: Int64)
    /// A step failed and was rolled back (the error says which and why).
    case migrationFailed(user: UserID, error: StoreError)
    /// The store was refused without being changed (too new, checksum changed, damaged, out of order).
    case storeRefused(user: UserID, error: StoreError)
    /// A copy of the store was taken (before migrating it, or for the reason given).
    case backupCreated(user: UserID, path: String, schemaVersion: Int64, reason: BackupReason = .beforeMigration)
    /// A rollback step ran a Down section.
    case rollbackStep(user: UserID, version: Int64, migration: String, durationMicroseconds: Int64)
    /// An applied migration whose file is gone; reported, not fatal.
    case unknownAppliedMigration(user: UserID, version: Int64, name: String)
    /// An existing store file was opened (metrics count opens; not journaled).
    case storeOpened(user: UserID)
    /// An open store was closed to make room or because it was idle (not journaled).
    case storeClosed(user: UserID, idle: Bool)
    /// The store was deleted: `removedFiles` files, backups kept or not.
    case storeDeleted(user: UserID, removedFiles: Int, keptBackups: Bool)
    /// A SQLite file became the store, at `schemaVersion` (the next request migrates it).
    case storeImported(user: UserID, schemaVersion: Int64, replaced: Bool, durationMicroseconds: Int64)
    /// The store was replaced by `source` (a backup) at `schemaVersion`.
    case storeRestored(user: UserID, source: String, schemaVersion: Int64, durationMicroseconds: Int64)
    /// More than one host: the local file was older than the replica's copy of `epoch` (another
    /// host owned the store since); it was set aside at `setAsideAt` and the newer copy restored.
    case storeSuperseded(user: UserID, setAsideAt: String, epoch: Int64)

    /// The user the event is about.
    public var user: UserID {
        switch self {
        case .storeCreated(let user, _, _), .migrationStarted(let user, _, _, _, _),
             .migrationStep(let user, _, _, _, _, _, _), .migrationFinished(let user, _, _, _, _),
             .migrationFailed(let user, _), .storeRefused(let user, _), .backupCreated(let user, _, _, _),
             .rollbackStep(let user, _, _, _), .unknownAppliedMigration(let user, _, _),
             .storeDeleted(let user, _, _), .storeImported(let user, _, _, _), .storeRestored(let user, _, _, _),
             .storeSuperseded(let user, _, _),
             .storeOpened(let user), .storeClosed(let user, _):
            return user
        }
    }
}

/// Receives ``StoreEvent``s. Called synchronously on the store's queue, so it must be quick
/// and must not block: hand the event off and return.
public protocol StoreObserver: Sendable {
    func record(_ event: StoreEvent)
}

/// An observer that drops everything.
public struct NoStoreObserver: StoreObserver {
    public init() {}
    public func record(_ event: StoreEvent) {}
}
