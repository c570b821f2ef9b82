import Foundation
import GRDB
import GRDBSQLite
import UserStoreConfiguration
import UserStoreCore
import Varlink

/// Runs one client statement on a store's connection and writes its result straight into the
/// reply, with the SQLite C API: prepared statements are cached per store, values go from the
/// statement to JSON without intermediate objects. Runs on the store's serial queue.
struct SQLRunner {
    /// What a call returns.
    enum Output {
        /// `{"columns": [...], "rows": [[...]]}` (Query).
        case rows
        /// `{"changes": n, "lastInsertRowId": n}` (Execute).
        case changes
        /// Both; columns and rows only for statements that return rows (Batch, admin Execute).
        case both
    }

    let store: Store
    let limits: RequestLimits

    /// How long a statement may run on the caller's (event loop) thread before it is
    /// interrupted and run again on the store's queue, where it may take its time.
    static let inlineBudgetNanoseconds: UInt64 = 2_000_000

    /// The whole reply (`{"parameters": …}` and its NUL) to one statement on `user`'s store,
    /// leased with `access`.
    ///
    /// When the store is idle a read-only statement runs right here, on the connection's event
    /// loop, for up to ``inlineBudgetNanoseconds``: most requests are point queries of a few
    /// microseconds, and two thread hand-offs would cost ten times that. A statement that runs
    /// longer is interrupted — outside a transaction (requests cannot open one) SQLite then
    /// rolls the whole statement back — and runs again on the store's serial queue, so a slow
    /// statement never holds up the other connections of the event loop for long. A statement
    /// that writes goes to the queue before it steps: its commit waits for an fsync, and
    /// eight users' commits must overlap on their own queues, not queue up on an event loop.
    static func reply(_ registry: StoreRegistry, user: UserID, access: StoreRegistry.Access, sql: String,
                      parameters: JSONValue?, output: Output, limits: RequestLimits) async throws -> [UInt8] {
        try await registry.withStore(user, access: access) { store in
            let runner = SQLRunner(store: store, limits: limits)
            let inline: Result<[UInt8], VarlinkError>?? = store.runIfIdle { connection in
                let result = runner.reply(connection, sql: sql, parameters: parameters, output: output,
                                          inlineBudget: inlineBudgetNanoseconds)
                if case .failure = result, store.guardian.yielded { return nil }
                return result
            }
            if case .some(.some(let result)) = inline { return try result.get() }
            return try await store.write { db in
                try runner.reply(db.sqliteConnection!, sql: sql, parameters: parameters, output: output, inlineBudget: nil).get()
            }
        }
    }

    /// The reply to one statement, built on the store's connection.
    func reply(_ connection: OpaquePointer, sql: String, parameters: JSONValue?, output: Output, inlineBudget: UInt64?) -> Result<[UInt8], VarlinkError> {
        var writer = JSONWriter(capacity: 256)
        var failure: VarlinkError?
        VarlinkReply.encode(into: &writer) { writer in
            do throws(VarlinkError) {
                try run(connection, sql: sql, parameters: parameters, output: output, inlineBudget: inlineBudget, into: &writer)
            } catch {
                failure = error
            }
        }
        if let failure { return .failure(failure) }
        return .success(writer.bytes)
    }

    /// Runs `sql` with `parameters`; `index` names the statement's place in a Batch for errors.
    /// With an `inlineBudget` (running off the store's queue), a statement that writes, or that
    /// still runs after that many nanoseconds, is given up with ``StoreGuard/yielded`` set.
    func run(_ connection: OpaquePointer, sql: String, parameters: JSONValue?, output: Output, index: Int? = nil,
             inlineBudget: UInt64? = nil, into writer: inout JSONWriter) throws(VarlinkError) {
        if SQLScript.firstKeyword(of: sql) == "VACUUM" {
            throw Errors.permissionDenied("VACUUM is run by the daemon, not by requests", statement: true)
        }
        let guardian = store.guardian
        let now = StoreGuard.now()
        let deadline = now + UInt64(limits.statementTimeoutMilliseconds) * 1_000_000
        var writerCopy = writer
        let result: Result<Void, VarlinkError> = guardian.withClientRules(deadline: deadline, yieldAt: inlineBudget.map { now + $0 } ?? .max) {
            do throws(VarlinkError) {
                let (statement, fresh) = try prepare(sql, on: connection, index: index)
                defer {
                    sqlite3_reset(statement)
                    sqlite3_clear_bindings(statement)
                    if fresh { store.statements.keep(statement, for: sql) }
                }
                if inlineBudget != nil, sqlite3_stmt_readonly(statement) == 0 {
                    guardian.yield()
                    return .failure(Errors.sqlError(code: SQLITE_INTERRUPT, message: "moved to the store's queue", index: index))
                }
                try ValueBinding.bind(parameters, to: statement)
                try execute(statement, on: connection, output: output, index: index, into: &writerCopy)
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        try result.get()
        writer = writerCopy
    }

    private func prepare(_ sql: String, on connection: OpaquePointer, index: Int?) throws(VarlinkError) -> (OpaquePointer, Bool) {
        if let cached = store.statements.take(sql) { return (cached, false) }
        var statement: OpaquePointer?
        var extra: String?
        let code = sql.withCString { start -> Int32 in
            var tail: UnsafePointer<CChar>?
            let code = sqlite3_prepare_v3(connection, start, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, &tail)
            if code == SQLITE_OK, let tail, tail.pointee != 0 { extra = String(cString: tail) }
            return code
        }
        guard code == SQLITE_OK else { throw failure(code, connection: connection, index: index) }
        guard let statement else {
            throw Errors.sqlError(code: SQLITE_MISUSE, message: "no SQL statement given", index: index)
        }
        if let extra, SQLScript.firstKeyword(of: extra) != nil {
            sqlite3_finalize(statement)
            throw Errors.sqlError(code: SQLITE_MISUSE, message: "one statement per call; send several with Batch", index: index)
        }
        return (statement, true)
    }

    private func execute(_ statement: OpaquePointer, on connection: OpaquePointer, output: Output, index: Int?,
                         into writer: inout JSONWriter) throws(VarlinkError) {
        let columnCount = sqlite3_column_count(statement)
        let writesRows = output == .rows || (output == .both && columnCount > 0)
        writer.raw(byte: UInt8(ascii: "{"))
        if writesRows {
            writer.raw("\"columns\":[")
            for column in 0..<columnCount {
                if column > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                writer.write(String(cString: sqlite3_column_name(statement, column)))
            }
            writer.raw("],\"rows\":[")
        }
        var firstRow = true
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { break }
            guard code == SQLITE_ROW else { throw failure(code, connection: connection, index: index) }
            guard writesRows else { continue }
            if !firstRow { writer.raw(byte: UInt8(ascii: ",")) }
            firstRow = false
            writer.raw(byte: UInt8(ascii: "["))
            for column in 0..<columnCount {
                if column > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                ValueWriter.write(column: column, of: statement, into: &writer)
            }
            writer.raw(byte: UInt8(ascii: "]"))
            if writer.bytes.count > limits.maxResponseBytes {
                throw Errors.limitExceeded("responseBytes", maximum: limits.maxResponseBytes)
            }
        }
        if writesRows { writer.raw(byte: UInt8(ascii: "]")) }
        if output != .rows {
            if writesRows { writer.raw(byte: UInt8(ascii: ",")) }
            let changes = sqlite3_stmt_readonly(statement) != 0 ? 0 : sqlite3_changes64(connection)
            writer.raw("\"changes\":")
            writer.write(Int64(changes))
            writer.raw(",\"lastInsertRowId\":")
            writer.write(sqlite3_last_insert_rowid(connection))
        }
        writer.raw(byte: UInt8(ascii: "}"))
    }

    /// The varlink error for a failed prepare or step.
    private func failure(_ code: Int32, connection: OpaquePointer, index: Int?) -> VarlinkError {
        let guardian = store.guardian
        if code & 0xFF == SQLITE_INTERRUPT, guardian.timedOut {
            return Errors.limitExceeded("statementMilliseconds", maximum: limits.statementTimeoutMilliseconds)
        }
        if code & 0xFF == SQLITE_AUTH, let refusal = guardian.refusal {
            return Errors.permissionDenied(refusal, statement: true)
        }
        return Errors.sqlError(code: sqlite3_extended_errcode(connection), message: String(cString: sqlite3_errmsg(connection)), index: index)
    }
}

/// Writes result cells as JSON (see the value table in io.userstore.Store).
enum ValueWriter {
    static func write(column: Int32, of statement: OpaquePointer, into writer: inout JSONWriter) {
        switch sqlite3_column_type(statement, column) {
        case SQLITE_INTEGER:
            writer.write(sqlite3_column_int64(statement, column))
        case SQLITE_FLOAT:
            writer.write(sqlite3_column_double(statement, column))
        case SQLITE_TEXT:
            let count = Int(sqlite3_column_bytes(statement, column))
            guard let text = sqlite3_column_text(statement, column) else { writer.write(""); return }
            let bytes = UnsafeBufferPointer(start: text, count: count)
            if bytes.allSatisfy({ $0 < 0x80 }) || String(validating: bytes, as: UTF8.self) != nil {
                writer.writeString(utf8: bytes)
            } else {
                // Text that is not UTF-8 (made by CAST of a blob) cannot be JSON text as is.
                writer.write(String(decoding: bytes, as: UTF8.self))
            }
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, column))
            let data = count == 0 ? Data() : Data(bytes: sqlite3_column_blob(statement, column)!, count: count)
            writer.raw("{\"blob\":")
            writer.write(data.base64EncodedString())
            writer.raw(byte: UInt8(ascii: "}"))
        default:
            writer.raw("null")
        }
    }
}
