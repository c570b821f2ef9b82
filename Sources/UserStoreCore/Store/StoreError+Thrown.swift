import GRDB

extension StoreError {
    /// What `error`, thrown while `user`'s store was opened, migrated or read, is to a client:
    /// itself when it is a ``StoreError``; a damaged store for SQLite's "not a database",
    /// "corrupt" and a page that fails its authentication; SQLite's other errors as they are;
    /// anything else a storage failure.
    static func from(_ error: any Error, user: UserID) -> StoreError {
        switch error {
        case let error as StoreError: return error
        case let error as DatabaseError:
            if error.extendedResultCode == .SQLITE_IOERR_DATA { return .storeDamaged(user: user, message: PageCipher.unauthenticPage) }
            switch error.resultCode {
            case .SQLITE_NOTADB, .SQLITE_CORRUPT: return .storeDamaged(user: user, message: error.message ?? "\(error.resultCode)")
            default: return .sqlError(code: error.extendedResultCode.rawValue, message: error.message ?? "\(error.resultCode)", sql: error.sql)
            }
        default: return .storageFailure(user: user, message: "\(error)")
        }
    }
}
