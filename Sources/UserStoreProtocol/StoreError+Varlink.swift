import UserStoreCore
import Varlink

/// The named varlink error for each ``StoreError``.
extension StoreError {
    public var varlinkError: VarlinkError {
        let prefix = "io.userstore.Store."
        switch self {
        case .invalidUser(let id, let reason):
            return VarlinkError(prefix + "InvalidUser", ["user": .string(InputQuote.prefix(id)), "reason": .string(reason)])
        case .migrationFailed(let user, let version, let migration, let message, let code, let schemaVersion):
            var parameters: [String: JSONValue] = [
                "user": .string(user.rawValue), "version": .integer(version), "migration": .string(migration),
                "message": .string(message), "schemaVersion": .integer(schemaVersion),
            ]
            if let code { parameters["sqliteCode"] = .integer(Int64(code)) }
            return VarlinkError(prefix + "MigrationFailed", parameters)
        case .storeTooNew(let user, let storeVersion, let knownVersion):
            return VarlinkError(prefix + "StoreTooNew", ["user": .string(user.rawValue), "storeVersion": .integer(storeVersion), "knownVersion": .integer(knownVersion)])
        case .checksumMismatch(let user, let version, let migration, _, _):
            return VarlinkError(prefix + "ChecksumMismatch", ["user": .string(user.rawValue), "version": .integer(version), "migration": .string(migration)])
        case .outOfOrderMigration(let user, let version, let migration, let latestApplied):
            return VarlinkError(prefix + "OutOfOrderMigration", ["user": .string(user.rawValue), "version": .integer(version),
                                                                 "migration": .string(migration), "latestApplied": .integer(latestApplied)])
        case .storeDamaged(let user, let message):
            return VarlinkError(prefix + "StoreDamaged", ["user": .string(user.rawValue), "message": .string(message)])
        case .irreversibleMigration(let user, let version, let migration):
            return VarlinkError(prefix + "SQLError", ["code": 1, "message": .string(StoreError.irreversibleMigration(user: user, version: version, migration: migration).description)])
        case .sqlError(let code, let message, _):
            return VarlinkError(prefix + "SQLError", ["code": .integer(Int64(code)), "message": .string(message)])
        case .storageFailure(let user, let message):
            return VarlinkError(prefix + "StorageFailure", ["user": .string(user.rawValue), "message": .string(message)])
        case .noSuchStore(let user):
            return VarlinkError("io.userstore.Admin.NoSuchStore", ["user": .string(user.rawValue)])
        case .noSuchBackup(let user, let backup):
            return VarlinkError("io.userstore.Admin.NoSuchBackup", ["user": .string(user.rawValue), "backup": .string(backup)])
        case .importRefused(let user, let reason):
            return VarlinkError("io.userstore.Admin.ImportRefused", ["user": .string(user.rawValue), "reason": .string(reason)])
        case .replicationUnavailable(let user, let message):
            return VarlinkError(prefix + "ReplicationUnavailable", ["user": .string(user.rawValue), "message": .string(message)])
        case .replicaDamaged(let user, let message):
            return VarlinkError(prefix + "ReplicaDamaged", ["user": .string(user.rawValue), "message": .string(message)])
        case .wrongHost(let user, let host, let address, let epoch):
            return VarlinkError(prefix + "WrongHost", ["user": .string(user.rawValue), "host": .string(host), "address": .string(address), "epoch": .integer(epoch)])
        case .clusterUnavailable(let user, let message):
            return VarlinkError(prefix + "ClusterUnavailable", ["user": .string(user.rawValue), "message": .string(message)])
        case .retry(let user, let reason):
            return VarlinkError(prefix + "Retry", ["user": .string(user.rawValue), "reason": .string(reason)])
        case .storeKeyMissing(let user, let message):
            return VarlinkError(prefix + "StoreKeyMissing", ["user": .string(user.rawValue), "message": .string(message)])
        case .storeErased(let user):
            return VarlinkError(prefix + "StoreErased", ["user": .string(user.rawValue)])
        }
    }
}
