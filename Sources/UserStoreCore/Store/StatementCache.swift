import GRDBSQLite
#if canImport(Glibc)
import Glibc
#endif

/// Prepared statements of one store, reused across requests with the same SQL.
///
/// Keyed by the SQL's bytes as they arrived (the JSON string's raw text), so a request finds
/// its statement without building a `String`. Bounded (a client sending ever-new SQL must not
/// grow memory without limit): when full, the least recently used statement is finalised.
/// Confined to whoever holds the store's connection, like the connection it belongs to;
/// ``finalizeAll()`` runs before the connection closes.
public final class StatementCache: @unchecked Sendable {
    /// At most this many statements are kept.
    public let capacity: Int
    private struct Entry {
        var sql: [UInt8]
        var statement: OpaquePointer
        var tick: UInt64

        /// The statement, marked used at `tick`, if it was prepared from `sql` (else a hash collision).
        mutating func take(_ sql: UnsafeBufferPointer<UInt8>, tick: UInt64) -> OpaquePointer? {
            guard self.sql.withUnsafeBufferPointer({ StatementCache.equal($0, sql) }) else { return nil }
            self.tick = tick
            return statement
        }
    }
    /// By a hash of the SQL; the bytes are compared too, so a collision is only a miss.
    private var entries: [Int: Entry] = [:]
    private var tick: UInt64 = 0
    /// The statement used last, compared before anything is hashed: a store's traffic is mostly
    /// one statement again and again. Its entry already has the newest `tick` (it was set when
    /// this became the recent one, and a repeat does not change the order).
    private var recentSQL: [UInt8] = []
    private var recentStatement: OpaquePointer?

    public init(capacity: Int = 64) {
        self.capacity = capacity
    }

    /// A reset statement for `sql`, if cached.
    public func take(_ sql: UnsafeBufferPointer<UInt8>) -> OpaquePointer? {
        if let recentStatement, recentSQL.withUnsafeBufferPointer({ Self.equal($0, sql) }) { return recentStatement }
        let key = Self.key(sql)
        guard let index = entries.index(forKey: key),
              let statement = entries.values[index].take(sql, tick: tick + 1) else { return nil }
        tick += 1
        remember(sql, statement)
        return statement
    }

    /// Keeps `statement` for `sql`.
    public func keep(_ statement: OpaquePointer, for sql: UnsafeBufferPointer<UInt8>) {
        let key = Self.key(sql)
        if let replaced = entries[key] {
            sqlite3_finalize(replaced.statement)
        } else if entries.count >= capacity, let oldest = entries.min(by: { $0.value.tick < $1.value.tick }) {
            sqlite3_finalize(oldest.value.statement)
            entries[oldest.key] = nil
        }
        tick += 1
        entries[key] = Entry(sql: Array(sql), statement: statement, tick: tick)
        remember(sql, statement)
    }

    /// Finalises every statement (before the connection closes).
    public func finalizeAll() {
        for entry in entries.values { sqlite3_finalize(entry.statement) }
        entries.removeAll()
        recentStatement = nil
        recentSQL = []
    }

    private func remember(_ sql: UnsafeBufferPointer<UInt8>, _ statement: OpaquePointer) {
        recentStatement = statement
        recentSQL.removeAll(keepingCapacity: true)
        recentSQL.append(contentsOf: sql)
    }

    private static func equal(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        a.count == b.count && (a.count == 0 || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0)
    }

    private static func key(_ sql: UnsafeBufferPointer<UInt8>) -> Int {
        var hasher = Hasher()
        hasher.combine(bytes: UnsafeRawBufferPointer(sql))
        return hasher.finalize()
    }
}
