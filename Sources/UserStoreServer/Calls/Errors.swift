import GRDB
import GRDBSQLite
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// The daemon's own named errors, and any error as a varlink error.
enum Errors {
    static func limitExceeded(_ limit: String, maximum: Int) -> VarlinkError {
        VarlinkError(.limitExceeded, ["limit": .string(limit), "maximum": .integer(Int64(maximum))])
    }

    /// The caller may not do this: not allowed at all (the access rules), or — `statement` —
    /// this statement is refused (ATTACH, the bookkeeping, a setting PRAGMA, …).
    static func permissionDenied(_ reason: String, statement: Bool = false) -> VarlinkError {
        var parameters: [String: JSONValue] = ["reason": .string(reason)]
        if statement { parameters["statement"] = true }
        return VarlinkError(.permissionDenied, parameters)
    }

    static func sqlError(code: Int32, message: String, index: Int? = nil) -> VarlinkError {
        var parameters: [String: JSONValue] = ["code": .integer(Int64(code)), "message": .string(message)]
        if let index { parameters["index"] = .integer(Int64(index)) }
        return VarlinkError(.sqlError, parameters)
    }

    static let shuttingDown = VarlinkError(.shuttingDown)

    /// The store's change log (docs/watch.md) could not be written or created.
    static func changeLog(_ error: ChangeLogError) -> VarlinkError {
        sqlError(code: SQLITE_ERROR, message: "the store's change log could not be written: \(error.message)")
    }

    /// The error for SQLite's `code` (an extended result code) on `user`'s store: the disk
    /// (full, I/O error) is `StorageFailure`, a damaged file `StoreDamaged`, anything else the
    /// statement's own `SQLError`.
    /// ``sqlite(code:message:user:index:)`` for an error GRDB reported.
    static func sqlite(_ error: DatabaseError, user: String) -> VarlinkError {
        sqlite(code: error.extendedResultCode.rawValue, message: error.message ?? "\(error.resultCode)", user: user)
    }

    static func sqlite(code: Int32, message: String, user: String, index: Int? = nil) -> VarlinkError {
        if code == ResultCode.SQLITE_IOERR_DATA.rawValue { // an encrypted store's page that fails authentication
            return VarlinkError(.storeDamaged, ["user": .string(user), "message": .string(PageCipher.unauthenticPage)])
        }
        switch code & 0xFF {
        case 13, 10, 14: // SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN
            return VarlinkError(.storageFailure, ["user": .string(user), "message": .string(message), "sqliteCode": .integer(Int64(code))])
        case 11, 26: // SQLITE_CORRUPT, SQLITE_NOTADB
            return VarlinkError(.storeDamaged, ["user": .string(user), "message": .string(message)])
        default:
            return sqlError(code: code, message: message, index: index)
        }
    }

    /// The transaction is not an open transaction of this connection.
    static func noSuchTransaction(_ transaction: String) -> VarlinkError {
        VarlinkError(.noSuchTransaction, ["transaction": .string(InputQuote.prefix(transaction))])
    }

    /// A call for the user whose store this connection's own open transaction holds, without
    /// naming the transaction: it would wait for a transaction only this connection can end.
    static func transactionInProgress(user: String, transaction: String) -> VarlinkError {
        VarlinkError(.transactionInProgress, ["user": .string(user), "transaction": .string(transaction)])
    }

    /// The transaction was rolled back without the client asking: `idle`, `total`, or why.
    static func transactionExpired(_ transaction: String, reason: String) -> VarlinkError {
        VarlinkError(.transactionExpired, ["transaction": .string(transaction), "reason": .string(reason)])
    }

    /// Replication is on but could not confirm a durable write (or durable was asked with
    /// replication off).
    static func replicationUnavailable(user: String, message: String) -> VarlinkError {
        VarlinkError(.replicationUnavailable, ["user": .string(user), "message": .string(message)])
    }

    /// More than one host: the user's bucket is moving, or moved while the call was forwarded;
    /// nothing was done.
    static func retry(user: String, reason: String) -> VarlinkError {
        VarlinkError(.retry, ["user": .string(user), "reason": .string(reason)])
    }

    /// Any error as a varlink error.
    static func from(_ error: any Error) -> VarlinkError {
        switch error {
        case let error as VarlinkError: return error
        case let error as StoreError: return error.varlinkError
        case let error as ConfigurationError:
            return VarlinkError(.invalidConfiguration, ["message": .string(error.description)])
        default: return VarlinkError(.storageFailure, ["user": "", "message": .string("\(error)")])
        }
    }
}
