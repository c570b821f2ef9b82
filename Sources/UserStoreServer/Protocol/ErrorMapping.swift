import UserStoreConfiguration
import UserStoreCore
import Varlink

/// The named varlink error for each ``StoreError``.
extension StoreError {
    var varlinkError: VarlinkError {
        let prefix = "io.userstore.Store."
        switch self {
        case .invalidUser(let id, let reason):
            return VarlinkError(prefix + "InvalidUser", ["user": .string(id), "reason": .string(reason)])
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
        }
    }
}

enum Errors {
    static func limitExceeded(_ limit: String, maximum: Int) -> VarlinkError {
        VarlinkError("io.userstore.Store.LimitExceeded", ["limit": .string(limit), "maximum": .integer(Int64(maximum))])
    }

    static func permissionDenied(_ reason: String) -> VarlinkError {
        VarlinkError("io.userstore.Store.PermissionDenied", ["reason": .string(reason)])
    }

    static func sqlError(code: Int32, message: String, index: Int? = nil) -> VarlinkError {
        var parameters: [String: JSONValue] = ["code": .integer(Int64(code)), "message": .string(message)]
        if let index { parameters["index"] = .integer(Int64(index)) }
        return VarlinkError("io.userstore.Store.SQLError", parameters)
    }

    static let shuttingDown = VarlinkError("io.userstore.Store.ShuttingDown")

    /// Any error as a varlink error.
    static func from(_ error: any Error) -> VarlinkError {
        switch error {
        case let error as VarlinkError: return error
        case let error as StoreError: return error.varlinkError
        case let error as ConfigurationError:
            return VarlinkError("io.userstore.Admin.InvalidConfiguration", ["message": .string(error.description)])
        default: return VarlinkError("io.userstore.Store.StorageFailure", ["user": "", "message": .string("\(error)")])
        }
    }
}
