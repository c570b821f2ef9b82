import GRDBSQLite

/// Prepared statements of one store, reused across requests with the same SQL.
///
/// Bounded (a client sending ever-new SQL must not grow memory without limit): when full, the
/// least recently used statement is finalised. Confined to the store's serial queue, like the
/// connection it belongs to; ``finalizeAll()`` runs before the connection closes.
public final class StatementCache: @unchecked Sendable {
    /// At most this many statements are kept.
    public let capacity: Int
    private var statements: [String: (statement: OpaquePointer, tick: UInt64)] = [:]
    private var tick: UInt64 = 0

    public init(capacity: Int = 64) {
        self.capacity = capacity
    }

    /// A reset statement for `sql`, if cached.
    public func take(_ sql: String) -> OpaquePointer? {
        guard let entry = statements[sql] else { return nil }
        tick += 1
        statements[sql] = (entry.statement, tick)
        return entry.statement
    }

    /// Keeps `statement` for `sql`.
    public func keep(_ statement: OpaquePointer, for sql: String) {
        if statements.count >= capacity, let oldest = statements.min(by: { $0.value.tick < $1.value.tick }) {
            sqlite3_finalize(oldest.value.statement)
            statements[oldest.key] = nil
        }
        tick += 1
        statements[sql] = (statement, tick)
    }

    /// Finalises every statement (before the connection closes).
    public func finalizeAll() {
        for entry in statements.values { sqlite3_finalize(entry.statement) }
        statements.removeAll()
    }
}
