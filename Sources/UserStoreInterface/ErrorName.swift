/// Every error of the daemon's varlink interfaces, by its full name: the one table the daemon
/// replies with and the Swift client and `userstorectl` compare with. The daemon's tests keep it
/// equal to the errors its interface files declare (`MethodTableTests`).
public enum ErrorName: String, CaseIterable, Sendable {
    // io.userstore.Store
    case positionLost = "io.userstore.Store.PositionLost"
    case watchTooSlow = "io.userstore.Store.WatchTooSlow"
    case invalidUser = "io.userstore.Store.InvalidUser"
    case migrationFailed = "io.userstore.Store.MigrationFailed"
    case storeTooNew = "io.userstore.Store.StoreTooNew"
    case checksumMismatch = "io.userstore.Store.ChecksumMismatch"
    case outOfOrderMigration = "io.userstore.Store.OutOfOrderMigration"
    case storeDamaged = "io.userstore.Store.StoreDamaged"
    case storageFailure = "io.userstore.Store.StorageFailure"
    case replicationUnavailable = "io.userstore.Store.ReplicationUnavailable"
    case replicaDamaged = "io.userstore.Store.ReplicaDamaged"
    case storeKeyMissing = "io.userstore.Store.StoreKeyMissing"
    case storeErased = "io.userstore.Store.StoreErased"
    case wrongHost = "io.userstore.Store.WrongHost"
    case hostUnreachable = "io.userstore.Store.HostUnreachable"
    case clusterUnavailable = "io.userstore.Store.ClusterUnavailable"
    case retry = "io.userstore.Store.Retry"
    case sqlError = "io.userstore.Store.SQLError"
    case permissionDenied = "io.userstore.Store.PermissionDenied"
    case limitExceeded = "io.userstore.Store.LimitExceeded"
    case invalidRequest = "io.userstore.Store.InvalidRequest"
    case shuttingDown = "io.userstore.Store.ShuttingDown"
    case noSuchTransaction = "io.userstore.Store.NoSuchTransaction"
    case transactionInProgress = "io.userstore.Store.TransactionInProgress"
    case transactionExpired = "io.userstore.Store.TransactionExpired"

    // io.userstore.Admin
    case replicaRefused = "io.userstore.Admin.ReplicaRefused"
    case noSuchHost = "io.userstore.Admin.NoSuchHost"
    case clusterOff = "io.userstore.Admin.ClusterOff"
    case metricsDisabled = "io.userstore.Admin.MetricsDisabled"
    case noSuchStore = "io.userstore.Admin.NoSuchStore"
    case noSuchBackup = "io.userstore.Admin.NoSuchBackup"
    case importRefused = "io.userstore.Admin.ImportRefused"
    case invalidMigrations = "io.userstore.Admin.InvalidMigrations"
    case invalidConfiguration = "io.userstore.Admin.InvalidConfiguration"
    case noRelease = "io.userstore.Admin.NoRelease"
    case releaseNotAllowed = "io.userstore.Admin.ReleaseNotAllowed"
    case irreversibleRelease = "io.userstore.Admin.IrreversibleRelease"
    case invalidRolloutPolicy = "io.userstore.Admin.InvalidRolloutPolicy"
    case releaseNotSaved = "io.userstore.Admin.ReleaseNotSaved"

    /// The name within its interface (`SQLError`): what the Swift client's errors call
    /// `name`.
    public var short: String { String(memberName(rawValue)) }
}
