/// How the engine treats the unusual cases of migrating a store.
public struct MigrationPolicy: Sendable, Equatable {
    /// What to do when an applied migration's file has changed.
    public enum ChecksumMismatch: String, Sendable, Equatable, CaseIterable {
        /// Refuse the store with ``StoreError/checksumMismatch(user:version:migration:recorded:current:)``.
        case refuse
        /// Report it as an event and go on.
        case warn
    }

    /// When a store that holds data is copied before it is migrated (`backupBeforeMigrating`;
    /// the raw values are the configuration's words).
    public enum BackupMode: String, Sendable, Equatable, CaseIterable {
        /// Only when a pending migration can lose data (``Migration/dataLossReason``), or a
        /// desired-schema reconcile may drop something: additive migrations run without a copy.
        case auto
        /// Always.
        case always = "true"
        /// Never.
        case never = "false"
    }

    /// How a fleet run makes the stores it migrates durable (`fleetSyncMethod`; the raw values
    /// are the configuration's words). Stores requests hold are always synced file by file.
    public enum FleetSyncMethod: String, Sendable, Equatable, CaseIterable {
        /// One `syncfs(2)` of the data directory's file system shared by every store waiting for it
        /// (``FileSystemSync``): few journal commits, but it also writes back other programs'
        /// dirty data on that file system.
        case syncfs
        /// fsync of each store's WAL, folder and database file: touches nothing else.
        case fsync
    }

    /// Apply never-applied migrations numbered below the store's latest applied one
    /// (otherwise they are an ``StoreError/outOfOrderMigration(user:version:migration:latestApplied:)``).
    public var allowOutOfOrder: Bool
    /// What a changed applied file does.
    public var checksumMismatch: ChecksumMismatch
    /// Keep serving a store at its last good version after one of its migrations failed
    /// (otherwise client requests get ``StoreError/migrationFailed(user:version:migration:message:sqliteCode:schemaVersion:)``).
    public var servePreviousVersionOnFailure: Bool
    /// When to take a consistent copy of a store that holds data before migrating it.
    public var backupBeforeMigrating: BackupMode
    /// How long such copies are kept after the migration committed (0: deleted at once).
    public var backupRetentionSeconds: Int
    /// Let a desired-schema reconcile drop tables, and columns that hold data.
    public var allowDestructiveSchemaChanges: Bool
    /// Create new stores as a copy of a store migrated once per migration set (a file write
    /// and two fsyncs instead of a transaction per migration). Such a store's journal shows
    /// one "created from the template" entry instead of one entry per migration step.
    public var newStoresFromTemplate: Bool
    /// How a fleet run makes its stores durable.
    public var fleetSyncMethod: FleetSyncMethod

    public init(allowOutOfOrder: Bool = false, checksumMismatch: ChecksumMismatch = .refuse,
                servePreviousVersionOnFailure: Bool = false, backupBeforeMigrating: BackupMode = .auto,
                backupRetentionSeconds: Int = 86_400, allowDestructiveSchemaChanges: Bool = false,
                newStoresFromTemplate: Bool = false, fleetSyncMethod: FleetSyncMethod = .syncfs) {
        self.allowOutOfOrder = allowOutOfOrder
        self.checksumMismatch = checksumMismatch
        self.servePreviousVersionOnFailure = servePreviousVersionOnFailure
        self.backupBeforeMigrating = backupBeforeMigrating
        self.backupRetentionSeconds = backupRetentionSeconds
        self.allowDestructiveSchemaChanges = allowDestructiveSchemaChanges
        self.newStoresFromTemplate = newStoresFromTemplate
        self.fleetSyncMethod = fleetSyncMethod
    }
}
