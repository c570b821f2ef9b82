import GRDB
import GRDBSQLite
import UserStoreConfiguration
import UserStoreCore
import Varlink

/// A `Query` called with `more`: its rows go out in replies of up to ``rowsPerReply`` rows (or
/// about ``bytesPerReply``), each with `continues` but the last, while the statement steps.
///
/// The stream holds its user's store for its whole length (a read transaction: one snapshot,
/// and that user's other calls wait their turn, as behind an interactive transaction), and it
/// steps the statement only as fast as the client reads: each reply waits until the client has
/// taken the previous ones (the connection's high watermark), so neither the daemon nor the
/// client ever holds the whole result. Only read-only statements stream. A stream longer than
/// `limits.transactionMilliseconds` ends with `LimitExceeded` (limit `transactionMilliseconds`),
/// and so does one whose client stopped reading for that long (the connection is closed).
struct StreamedQuery {
    let store: Store
    let limits: RequestLimits

    static let rowsPerReply = 512
    static let bytesPerReply = 64 << 10

    /// Runs `statement` of `message` and sends its replies through `send`.
    func run(_ message: JSONMessage, _ statement: SQLRunner.Statement, send: ReplySink) async throws {
        let key = Store.TransactionKey(OpenTransaction.nextKey.add(1, ordering: .relaxed).newValue)
        try await begin(key)
        let cursor = Cursor(runner: SQLRunner(store: store, limits: limits))
        let started = StoreClock.now()
        var failure: (any Error)?
        do {
            while true {
                let (bytes, last) = try await enqueue(key) { db in
                    message.withView { view in cursor.next(db.sqliteConnection!, view, statement) }
                }.get()
                try await send(bytes)
                if last { break }
                if StoreClock.now() - started > UInt64(limits.transactionMilliseconds) * 1_000_000 {
                    throw Errors.limitExceeded("transactionMilliseconds", maximum: limits.transactionMilliseconds)
                }
            }
        } catch {
            failure = error
        }
        _ = await enqueue(key) { _ in cursor.finalize() }
        await withCheckedContinuation { continuation in
            store.endTransaction(key, commit: false) { _ in continuation.resume() }
        }
        if let failure { throw failure }
    }

    private func begin(_ key: Store.TransactionKey) async throws {
        let store = self.store
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            store.beginTransaction(key, immediate: false) { error in
                if let error {
                    continuation.resume(throwing: Errors.sqlite(error, user: store.user.rawValue))
                } else {
                    continuation.resume()
                }
            }
        }
    }

    private func enqueue<T: Sendable>(_ key: Store.TransactionKey, _ body: @escaping @Sendable (Database) -> T) async -> T {
        await withCheckedContinuation { continuation in
            store.enqueue(transaction: key, body) { continuation.resume(returning: $0) }
        }
    }

    /// The statement between replies; touched only on the store's queue (one call at a time,
    /// in order), hence `@unchecked Sendable`.
    final class Cursor: @unchecked Sendable {
        let runner: SQLRunner
        private var statement: OpaquePointer?

        init(runner: SQLRunner) {
            self.runner = runner
        }

        /// The next reply: up to ``StreamedQuery/rowsPerReply`` rows, and whether it is the last.
        func next(_ connection: OpaquePointer, _ view: JSONView, _ call: SQLRunner.Statement) -> Result<([UInt8], Bool), VarlinkError> {
            let guardian = runner.store.guardian
            let deadline = StoreGuard.now() + UInt64(runner.limits.statementTimeoutMilliseconds) * 1_000_000
            return guardian.withClientRules(deadline: deadline) {
                do throws(VarlinkError) {
                    let statement: OpaquePointer
                    if let prepared = self.statement { statement = prepared } else { statement = try prepare(connection, view, call) }
                    var writer = JSONWriter(capacity: Self.initialCapacity)
                    var last = false
                    writer.raw("{\"parameters\":{")
                    SQLRunner.writeColumns(of: statement, into: &writer)
                    writer.raw(",\"rows\":[")
                    let columns = sqlite3_column_count(statement)
                    var rows = 0
                    while rows < StreamedQuery.rowsPerReply, writer.bytes.count < StreamedQuery.bytesPerReply {
                        let code = sqlite3_step(statement)
                        if code == SQLITE_DONE { last = true; break }
                        guard code == SQLITE_ROW else { throw runner.failure(code, connection: connection, index: nil) }
                        if rows > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                        ValueWriter.writeRow(of: statement, columns: columns, into: &writer)
                        rows += 1
                    }
                    writer.raw("]}")
                    if !last { writer.raw(",\"continues\":true") }
                    writer.raw("}")
                    writer.raw(byte: 0)
                    return .success((writer.bytes, last))
                } catch {
                    return .failure(error)
                }
            }
        }

        static let initialCapacity = StreamedQuery.bytesPerReply + 4096

        /// Prepares the call's statement (not from the store's cache: it lives across calls).
        private func prepare(_ connection: OpaquePointer, _ view: JSONView, _ call: SQLRunner.Statement) throws(VarlinkError) -> OpaquePointer {
            let prepared = try view.withStringBytes(call.sql) { sql throws(VarlinkError) in
                try runner.prepare(sql, on: connection, index: nil, cached: false)
            }
            statement = prepared
            guard sqlite3_stmt_readonly(prepared) != 0 else {
                throw Errors.sqlError(code: SQLITE_READONLY, message: "a streamed Query (more) runs read-only statements only; use Execute or Batch to write")
            }
            try ValueBinding.bind(view, call.parameters, to: prepared)
            return prepared
        }

        func finalize() {
            sqlite3_finalize(statement)
            statement = nil
        }
    }
}
