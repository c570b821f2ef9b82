import Foundation
import GRDB
import GRDBSQLite
import UserStoreConfiguration
import UserStoreCore
import Varlink

/// Runs one client statement on a store's connection and writes its result straight into the
/// reply, with the SQLite C API: prepared statements are cached per store, values go from the
/// statement to JSON without intermediate objects. Runs wherever the store's connection is held:
/// its serial queue, or an event loop for a read-only statement on an idle store.
package struct SQLRunner {
    /// What a call returns.
    package enum Output {
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

    /// One statement of a call: the tokens of its SQL (a string) and parameters in the call's
    /// ``JSONView``, and its place in a Batch (for errors).
    package struct Statement {
        package var sql: Int
        package var parameters: Int?
        package var index: Int?
    }

    /// Appends the reply to `statement` — its result, or the error it ended with — to `writer`.
    ///
    /// With an `inlineBudget` (running off the store's queue, on an event loop), a statement
    /// that writes, or that still runs after that many nanoseconds, is given up: nothing is
    /// written and the result is false, for the caller to run it again on the store's queue.
    /// Outside a transaction (requests cannot open one) SQLite rolls an interrupted statement
    /// back whole. A statement that writes yields before it steps: its commit waits for an
    /// fsync, and users' commits must overlap on their own queues, not line up on an event loop.
    func reply(_ connection: OpaquePointer, _ view: JSONView, _ statement: Statement, output: Output,
               inlineBudget: UInt64?, inTransaction: Bool = false, into writer: inout JSONWriter) -> Bool {
        let mark = writer.bytes.count
        do throws(VarlinkError) {
            try VarlinkReply.encode(into: &writer) { (writer: inout JSONWriter) throws(VarlinkError) in
                try run(connection, view, statement, output: output, inlineBudget: inlineBudget, inTransaction: inTransaction, into: &writer)
            }
            return true
        } catch {
            writer.bytes.removeSubrange(mark...)
            if inlineBudget != nil, store.guardian.yielded { return false }
            VarlinkReply.encode(error, into: &writer)
            return true
        }
    }

    /// Runs one statement, writing its result object into `writer`. With an `inlineBudget`, a
    /// statement that writes, or that still runs after that many nanoseconds, is given up with
    /// ``StoreGuard/yielded`` set. `inTransaction`: it belongs to an interactive transaction,
    /// where savepoints are allowed.
    func run(_ connection: OpaquePointer, _ view: JSONView, _ statement: Statement, output: Output,
             inlineBudget: UInt64? = nil, inTransaction: Bool = false, into writer: inout JSONWriter) throws(VarlinkError) {
        let guardian = store.guardian
        let now = StoreGuard.now()
        let deadline = now + UInt64(limits.statementTimeoutMilliseconds) * 1_000_000
        let start = writer.bytes.count
        let result: Result<Void, VarlinkError> = guardian.withClientRules(deadline: deadline, yieldAt: inlineBudget.map { now + $0 } ?? .max,
                                                                          savepoints: inTransaction) {
            do throws(VarlinkError) {
                let prepared = try view.withStringBytes(statement.sql) { sql throws(VarlinkError) in
                    try prepare(sql, on: connection, index: statement.index)
                }
                defer {
                    sqlite3_reset(prepared)
                    sqlite3_clear_bindings(prepared)
                }
                if inlineBudget != nil, sqlite3_stmt_readonly(prepared) == 0 {
                    guardian.yield()
                    return .failure(Errors.sqlError(code: SQLITE_INTERRUPT, message: "moved to the store's queue", index: statement.index))
                }
                try ValueBinding.bind(view, statement.parameters, to: prepared)
                try ChangeRecording(store: store, connection: connection, statement: prepared, inTransaction: inTransaction).around {
                    () throws(VarlinkError) in
                    try execute(prepared, on: connection, output: output, index: statement.index, start: start, into: &writer)
                }
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        try result.get()
    }

    /// The statement for `sql`: cached, or prepared (and cached) now. Not `cached`: prepared
    /// for the caller alone, who finalizes it (a streamed query's, which lives across calls).
    func prepare(_ sql: UnsafeBufferPointer<UInt8>, on connection: OpaquePointer, index: Int?, cached: Bool = true) throws(VarlinkError) -> OpaquePointer {
        if cached, let statement = store.statements.take(sql) { return statement }
        let text = String(decoding: sql, as: UTF8.self)
        if SQLScript.firstKeyword(of: text) == "VACUUM" {
            throw Errors.permissionDenied("VACUUM is run by the daemon, not by requests", statement: true)
        }
        var statement: OpaquePointer?
        var extra: String?
        let code = text.withCString { start -> Int32 in
            var tail: UnsafePointer<CChar>?
            let code = sqlite3_prepare_v3(connection, start, -1, cached ? UInt32(SQLITE_PREPARE_PERSISTENT) : 0, &statement, &tail)
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
        if cached { store.statements.keep(statement, for: sql) }
        return statement
    }

    private func execute(_ statement: OpaquePointer, on connection: OpaquePointer, output: Output, index: Int?,
                         start: Int, into writer: inout JSONWriter) throws(VarlinkError) {
        let columnCount = sqlite3_column_count(statement)
        let writesRows = output == .rows || (output == .both && columnCount > 0)
        writer.raw(byte: UInt8(ascii: "{"))
        if writesRows {
            Self.writeColumns(of: statement, into: &writer)
            writer.raw(",\"rows\":[")
        }
        var firstRow = true
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { break }
            guard code == SQLITE_ROW else { throw failure(code, connection: connection, index: index) }
            guard writesRows else { continue }
            if !firstRow { writer.raw(byte: UInt8(ascii: ",")) }
            firstRow = false
            ValueWriter.writeRow(of: statement, columns: columnCount, into: &writer)
            if writer.bytes.count - start > limits.maxResponseBytes {
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

    /// `"columns":[…]`: the result's column names.
    static func writeColumns(of statement: OpaquePointer, into writer: inout JSONWriter) {
        writer.raw("\"columns\":[")
        for column in 0..<sqlite3_column_count(statement) {
            if column > 0 { writer.raw(byte: UInt8(ascii: ",")) }
            let name = sqlite3_column_name(statement, column)!
            name.withMemoryRebound(to: UInt8.self, capacity: 1) { writer.writeString(utf8: UnsafeBufferPointer(start: $0, count: strlen(name))) }
        }
        writer.raw(byte: UInt8(ascii: "]"))
    }

    /// The varlink error for a failed prepare or step.
    func failure(_ code: Int32, connection: OpaquePointer, index: Int?) -> VarlinkError {
        let guardian = store.guardian
        if code & 0xFF == SQLITE_INTERRUPT, guardian.timedOut {
            return Errors.limitExceeded("statementMilliseconds", maximum: limits.statementTimeoutMilliseconds)
        }
        if code & 0xFF == SQLITE_AUTH, let refusal = guardian.refusal {
            return Errors.permissionDenied(refusal, statement: true)
        }
        let extended = sqlite3_extended_errcode(connection), message = String(cString: sqlite3_errmsg(connection))
        if code & 0xFF == SQLITE_CORRUPT || code & 0xFF == SQLITE_NOTADB {
            // Damaged: the store is refused from now on (nothing more is written to it).
            store.markDamaged(message)
        }
        return Errors.sqlite(code: extended, message: message, user: store.user.rawValue, index: index)
    }
}

/// Writes result cells as JSON (see the value table in io.userstore.Store).
enum ValueWriter {
    /// The current row of `statement` as a JSON array.
    static func writeRow(of statement: OpaquePointer, columns: Int32, into writer: inout JSONWriter) {
        writer.raw(byte: UInt8(ascii: "["))
        for column in 0..<columns {
            if column > 0 { writer.raw(byte: UInt8(ascii: ",")) }
            write(column: column, of: statement, into: &writer)
        }
        writer.raw(byte: UInt8(ascii: "]"))
    }

    @inline(__always)
    static func write(column: Int32, of statement: OpaquePointer, into writer: inout JSONWriter) {
        ValueJSON.write(column: column, of: statement, into: &writer)
    }
}
