import Varlink

/// Every method the daemon serves: the one table that the router, the store-call pipeline, the
/// metrics and the cluster's forwarder dispatch on, so that a call's name is matched once, in
/// one place. `MethodTableTests` keeps it equal to the methods of `Interfaces/*.varlink`.
///
/// Adding a method: a case here, its line in the interface file, and its handler's `switch`
/// (the compiler points at every `switch` that must learn it).
package enum Method: String, CaseIterable, Sendable {
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
    enum Interface: String, CaseIterable, Sendable {
        /// Open to every allowed client (`access.clientUsers` / `access.clientGroups`).
        case store = "io.userstore.Store"
        /// Administrators only (`access.adminUsers` / `access.adminGroups`).
        case admin = "io.userstore.Admin"
        /// Introspection, open to every connected peer.
        case service = "org.varlink.service"
    }

    var interface: Interface {
        switch self {
        case .open, .query, .execute, .batch, .begin, .commit, .rollback, .watch: .store
        case .getInfo, .getInterfaceDescription: .service
        default: .admin
        }
    }

    /// The name within its interface (`Query`).
    var member: Substring { rawValue[rawValue.index(after: rawValue.lastIndex(of: ".")!)...] }

    /// The method named by the string at `token` of `view`, read in place: the request path's
    /// own methods (``Interface/store``) without making a `String`, any other by name.
    private static func named(_ view: JSONView, _ token: Int) -> Method? {
        guard view.kind(token) == .string else { return nil }
        // Compared with the raw values' own bytes: literals, so no copy and no reference counting.
        for method in storeMethods where method.rawValue.utf8.withContiguousStorageIfAvailable({ view.stringEquals(token, $0) }) == true {
            return method
        }
        return Method(rawValue: view.string(token))
    }

    /// The method of the call in `view` (its `method` member), if the daemon has it.
    package static func of(_ view: JSONView) -> Method? {
        guard view.kind(0) == .object, let token = view.member("method", of: 0) else { return nil }
        return named(view, token)
    }

    /// The ``Interface/store`` methods, most frequent first.
    static let storeMethods: [Method] = [.query, .execute, .open, .batch, .begin, .commit, .rollback, .watch]
}
