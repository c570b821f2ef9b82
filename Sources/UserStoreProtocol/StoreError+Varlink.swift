import UserStoreCore
import UserStoreInterface
import Varlink

/// The named varlink error for each ``StoreError``.
extension StoreError {
    public var varlinkError: VarlinkError {
        switch self {
        case .invalidUser(let id, let reason):
            return VarlinkError(.invalidUser, ["user": .string(InputQuote.prefix(id)), "reason": .string(reason)])
        case .migrationFailed(let user, let version, let migration, let message, let code, let schemaVersion):
            var parameters: [String: JSONValue] = [
                "user": .string(user.rawValue), "version": .integer(version), "migration": .string(migration),
                "message": .string(message), "schemaVersion": .integer(schemaVersion),
            ]
            if let code { parameters["sqliteCode"] = .integer(Int64(code)) }
            return VarlinkError(.migrationFailed, parameters)
        case .storeTooNew(let user, let storeVersion, let knownVersion):
            return VarlinkError(.storeTooNew, ["user": .string(user.rawValue), "storeVersion": .integer(storeVersion), "knownVersion": .integer(knownVersion)])
        case .checksumMismatch(let user, let version, let migration, _, _):
            return VarlinkError(.checksumMismatch, ["user": .string(user.rawValue), "version": .integer(version), "migration": .string(migration)])
        case .outOfOrderMigration(let user, let version, let migration, let latestApplied):
            return VarlinkError(.outOfOrderMigration, ["user": .string(user.rawValue), "version": .integer(version),
                                                                 "migration": .string(migration), "latestApplied": .integer(latestApplied)])
        case .storeDamaged(let user, let message):
            return VarlinkError(.storeDamaged, ["user": .string(user.rawValue), "message": .string(message)])
        case .irreversibleMigration(let user, let version, let migration):
            return VarlinkError(.sqlError, ["code": 1, "message": .string(StoreError.irreversibleMigration(user: user, version: version, migration: migration).description)])
        case .sqlError(let code, let message, _):
            return VarlinkError(.sqlError, ["code": .integer(Int64(code)), "message": .string(message)])
        case .storageFailure(let user, let message):
            return VarlinkError(.storageFailure, ["user": .string(user.rawValue), "message": .string(message)])
        case .noSuchStore(let user):
            return VarlinkError(.noSuchStore, ["user": .string(user.rawValue)])
        case .noSuchBackup(let user, let backup):
            return VarlinkError(.noSuchBackup, ["user": .string(user.rawValue), "backup": .string(backup)])
        case .importRefused(let user, let reason):
            return VarlinkError(.importRefused, ["user": .string(user.rawValue), "reason": .string(reason)])
        case .replicationUnavailable(let user, let message):
            return VarlinkError(.replicationUnavailable, ["user": .string(user.rawValue), "message": .string(message)])
        case .replicaDamaged(let user, let message):
            return VarlinkError(.replicaDamaged, ["user": .string(user.rawValue), "message": .string(message)])
        case .wrongHost(let user, let host, let address, let epoch):
            return VarlinkError(.wrongHost, ["user": .string(user.rawValue), "host": .string(host), "address": .string(address), "epoch": .integer(epoch)])
        case .clusterUnavailable(let user, let message):
            return VarlinkError(.clusterUnavailable, ["user": .string(user.rawValue), "message": .string(message)])
        case .retry(let user, let reason):
            return VarlinkError(.retry, ["user": .string(user.rawValue), "reason": .string(reason)])
        case .storeKeyMissing(let user, let message):
            return VarlinkError(.storeKeyMissing, ["user": .string(user.rawValue), "message": .string(message)])
        case .storeErased(let user):
            return VarlinkError(.storeErased, ["user": .string(user.rawValue)])
        }
    }
}
