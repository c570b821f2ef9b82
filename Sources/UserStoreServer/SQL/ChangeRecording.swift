import GRDBSQLite
import UserStoreCore
import Varlink

/// Keeps a client statement's changes in the store's change log (``ChangeRecorder``), in the
/// transaction that commits them, once the store records (it was watched once; until then
/// nothing here runs):
///
/// - a statement that writes outside a transaction (autocommit) runs inside `BEGIN IMMEDIATE`
///   … its changes into the log … `COMMIT`, so the log and the rows commit together (a read-only
///   statement is left alone: point queries pay nothing);
/// - inside a transaction, a client's `SAVEPOINT` / `RELEASE` / `ROLLBACK TO` is followed, so
///   changes a savepoint rolled back are never reported; the transaction's own COMMIT writes
///   the log (Store.endTransaction, BatchRunner).
struct ChangeRecording {
    let store: Store
    let connection: OpaquePointer
    let statement: OpaquePointer
    let inTransaction: Bool

    func around(_ body: () throws(VarlinkError) -> Void) throws(VarlinkError) {
        guard let recorder = store.recorder, recorder.isRecording(connection) else { return try body() }
        if sqlite3_get_autocommit(connection) == 0 {
            try body()
            if inTransaction, let savepoint = savepointStatement() { recorder.savepoint(savepoint) }
            return
        }
        guard sqlite3_stmt_readonly(statement) == 0 else { return try body() }
        try control(recorder, "BEGIN IMMEDIATE")
        do throws(VarlinkError) {
            try body()
            do {
                try store.guardian.withoutClientRules { () throws(ChangeLogError) in try recorder.flush(connection) }
            } catch {
                throw Errors.changeLog(error)
            }
            try control(recorder, "COMMIT")
        } catch {
            if sqlite3_get_autocommit(connection) == 0 { _ = try? control(recorder, "ROLLBACK") }
            throw error
        }
    }

    /// The client's savepoint statement, if this is one (only read inside a transaction).
    private func savepointStatement() -> ChangeRecorder.SavepointStatement? {
        sqlite3_sql(statement).flatMap { ChangeRecorder.SavepointStatement.parse(String(cString: $0)) }
    }

    /// The daemon's own transaction control, beside the client's statement (prepared once).
    private func control(_ recorder: ChangeRecorder, _ sql: StaticString) throws(VarlinkError) {
        let code = store.guardian.withoutClientRules { recorder.transactionControl(connection, sql) }
        guard code == SQLITE_OK else {
            throw Errors.sqlite(code: sqlite3_extended_errcode(connection), message: String(cString: sqlite3_errmsg(connection)),
                                user: store.user.rawValue, index: nil)
        }
    }
}
