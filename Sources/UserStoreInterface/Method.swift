/// Every method of the daemon's varlink interfaces, by its full name: the one table the daemon
/// dispatches on and the Swift client and `userstorectl` call by, so that no name is written
/// twice. The daemon's tests keep it equal to the methods its interface files declare
/// (`MethodTableTests`).
///
/// Adding a method: a case here, its line in the interface file, and the daemon's handler
/// (the compiler points at every `switch` that must learn it).
public enum Method: String, CaseIterable, Sendable {
    // io.userstore.Store
    case open = "io.userstore.Store.Open"
    case query = "io.userstore.Store.Query"
    case execute = "io.userstore.Store.Execute"
    case batch = "io.userstore.Store.Batch"
    case begin = "io.userstore.Store.Begin"
    case commit = "io.userstore.Store.Commit"
    case rollback = "io.userstore.Store.Rollback"
    case watch = "io.userstore.Store.Watch"

    // io.userstore.Admin
    case status = "io.userstore.Admin.Status"
    case listStores = "io.userstore.Admin.ListStores"
    case migrate = "io.userstore.Admin.Migrate"
    case plan = "io.userstore.Admin.Plan"
    case verify = "io.userstore.Admin.Verify"
    case rollbackMigrations = "io.userstore.Admin.Rollback"
    case backup = "io.userstore.Admin.Backup"
    case reload = "io.userstore.Admin.Reload"
    case acceptChecksums = "io.userstore.Admin.AcceptChecksums"
    case adminExecute = "io.userstore.Admin.Execute"
    case top = "io.userstore.Admin.Top"
    case deleteStore = "io.userstore.Admin.DeleteStore"
    case exportStore = "io.userstore.Admin.ExportStore"
    case importStore = "io.userstore.Admin.ImportStore"
    case listBackups = "io.userstore.Admin.ListBackups"
    case restoreStore = "io.userstore.Admin.RestoreStore"
    case rotateStoreKey = "io.userstore.Admin.RotateStoreKey"
    case encryptStores = "io.userstore.Admin.EncryptStores"
    case replication = "io.userstore.Admin.Replication"
    case restoreFromReplica = "io.userstore.Admin.RestoreFromReplica"
    case initReplica = "io.userstore.Admin.InitReplica"
    case takeOverReplica = "io.userstore.Admin.TakeOverReplica"
    case cluster = "io.userstore.Admin.Cluster"
    case moveBucket = "io.userstore.Admin.MoveBucket"
    case drainHost = "io.userstore.Admin.DrainHost"
    case rebalance = "io.userstore.Admin.Rebalance"
    case release = "io.userstore.Admin.Release"
    case startRelease = "io.userstore.Admin.StartRelease"
    case advanceRelease = "io.userstore.Admin.AdvanceRelease"
    case resumeRelease = "io.userstore.Admin.ResumeRelease"
    case abortRelease = "io.userstore.Admin.AbortRelease"
    case trialRelease = "io.userstore.Admin.TrialRelease"
    case queryStores = "io.userstore.Admin.QueryStores"

    // org.varlink.service
    case getInfo = "org.varlink.service.GetInfo"
    case getInterfaceDescription = "org.varlink.service.GetInterfaceDescription"

    /// The interfaces, each with the access it needs.
    public enum Interface: String, CaseIterable, Sendable {
        /// Open to every allowed client (`access.clientUsers` / `access.clientGroups`).
        case store = "io.userstore.Store"
        /// Administrators only (`access.adminUsers` / `access.adminGroups`).
        case admin = "io.userstore.Admin"
        /// Introspection, open to every connected peer.
        case service = "org.varlink.service"
    }

    /// The interface the method belongs to.
    public var interface: Interface {
        switch self {
        case .open, .query, .execute, .batch, .begin, .commit, .rollback, .watch: .store
        case .getInfo, .getInterfaceDescription: .service
        default: .admin
        }
    }

    /// The name within its interface (`Query`).
    public var member: Substring { memberName(rawValue) }
}

/// The last component of a qualified varlink name (`io.userstore.Store.Query` → `Query`).
func memberName(_ qualified: String) -> Substring {
    qualified[qualified.index(after: qualified.lastIndex(of: ".")!)...]
}
