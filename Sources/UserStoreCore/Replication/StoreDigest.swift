import Crypto
import Foundation
import GRDBSQLite

/// What a store holds, reduced to a SHA-256 per table and one for its schema — SQLite's
/// `dbhash` idea: two files with the same rows and the same schema have the same digest, however
/// their pages are laid out (a replica rebuilt from LTX files and the live file differ page by
/// page but must not differ here).
///
/// Litestream's own tables (`_litestream_seq`, `_litestream_lock`) are left out: Litestream
/// writes them on its own schedule, in the live file only. Virtual tables are left out too: their
/// rows live in their shadow tables, which are ordinary tables and counted.
public struct StoreDigest: Sendable, Equatable {
    /// One table: its row count and the SHA-256 of its rows in key order.
    public struct Table: Sendable, Equatable {
        public var rows: Int64
        public var hash: [UInt8]
    }

    /// A file that could not be opened or read (SQLite's message).
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Every table by name.
    public var tables: [String: Table]
    /// SHA-256 of every table's, index's, view's and trigger's SQL.
    public var schema: [UInt8]

    /// Reads the digest of the database open on `connection` (in one read transaction, so that
    /// every table is read at the same point).
    public static func read(_ connection: OpaquePointer) throws -> StoreDigest {
        let inTransaction = sqlite3_get_autocommit(connection) == 0
        if !inTransaction { try execute(connection, "BEGIN") }
        defer { if !inTransaction { _ = try? execute(connection, "COMMIT") } }
        var schema = SHA256()
        var tables: [String: (sql: String, withoutRowID: Bool)] = [:]
        try each(connection, """
            SELECT type, name, coalesce(sql, '') FROM sqlite_schema
            WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND tbl_name NOT IN ('_litestream_seq', '_litestream_lock')
            ORDER BY type, name
            """) { row in
            let type = text(row, 0), name = text(row, 1), sql = text(row, 2)
            schema.update(data: Array("\(type)\u{0}\(name)\u{0}\(sql)\u{0}".utf8))
            if type == "table" && !sql.uppercased().hasPrefix("CREATE VIRTUAL TABLE") {
                tables[name] = (sql, false)
            }
        }
        try each(connection, "SELECT name FROM pragma_table_list WHERE wr = 1 AND schema = 'main'") { row in
            tables[text(row, 0)]?.withoutRowID = true
        }
        var digests: [String: Table] = [:]
        for (name, table) in tables {
            let quoted = "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            let order = table.withoutRowID ? try primaryKeyOrder(connection, name) : "rowid"
            var hash = SHA256()
            var rows: Int64 = 0
            try each(connection, "SELECT * FROM \(quoted) ORDER BY \(order)") { row in
                rows += 1
                for column in 0..<sqlite3_column_count(row) { hashValue(row, column, into: &hash) }
            }
            digests[name] = Table(rows: rows, hash: Array(hash.finalize()))
        }
        return StoreDigest(tables: digests, schema: Array(schema.finalize()))
    }

    /// Opens the file at `path` read-only (a connection of its own, beside the daemon's) and
    /// reads its digest.
    public static func read(path: String) throws -> StoreDigest {
        let reader = try Reader(path: path)
        defer { reader.close() }
        return try reader.digest()
    }

    /// What differs between this digest (the live store) and `replica`, one line per table or
    /// for the schema; empty when they are equal.
    public func differences(from replica: StoreDigest) -> [String] {
        var lines: [String] = []
        if schema != replica.schema { lines.append("the schema differs") }
        for name in Set(tables.keys).union(replica.tables.keys).sorted() {
            switch (tables[name], replica.tables[name]) {
            case let (here?, there?) where here != there:
                lines.append(here.rows == there.rows ? "table \(name): \(here.rows) rows in both, with different contents"
                    : "table \(name): \(here.rows) rows here, \(there.rows) in the replica")
            case let (here?, nil): lines.append("table \(name): \(here.rows) rows here, missing from the replica")
            case let (nil, there?): lines.append("table \(name): missing here, \(there.rows) rows in the replica")
            default: break
            }
        }
        return lines
    }

    /// A read-only connection of its own to a store file, with a read transaction begun by
    /// ``pin()``: the store as it was at that moment, however it changes afterwards (WAL mode).
    public final class Reader: @unchecked Sendable { // one user at a time: whoever opened it
        private let connection: OpaquePointer

        public init(path: String) throws {
            var connection: OpaquePointer?
            let status = sqlite3_open_v2(path, &connection, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nil)
            guard status == SQLITE_OK, let connection else {
                let message = connection.map { String(cString: sqlite3_errmsg($0)) } ?? "\(status)"
                sqlite3_close_v2(connection)
                throw Failure(description: "cannot open \(path): \(message)")
            }
            sqlite3_busy_timeout(connection, 5000)
            self.connection = connection
        }

        /// Begins the read transaction that fixes what ``digest()`` sees.
        public func pin() throws {
            try StoreDigest.execute(connection, "BEGIN")
            try StoreDigest.each(connection, "SELECT count(*) FROM sqlite_schema") { _ in }
        }

        public func digest() throws -> StoreDigest {
            try StoreDigest.read(connection)
        }

        /// Ends the read transaction, if any, and closes the connection (never the last one to
        /// a replicated store: closing it checkpoints nothing).
        public func close() {
            if sqlite3_get_autocommit(connection) == 0 { _ = try? StoreDigest.execute(connection, "ROLLBACK") }
            sqlite3_close_v2(connection)
        }
    }

    // MARK: SQLite

    /// `ORDER BY` for a WITHOUT ROWID table: its primary key's columns in key order.
    private static func primaryKeyOrder(_ connection: OpaquePointer, _ table: String) throws -> String {
        var columns: [(Int64, Int32)] = []
        let literal = "'" + table.replacingOccurrences(of: "'", with: "''") + "'"
        try each(connection, "SELECT pk, cid FROM pragma_table_info(\(literal)) WHERE pk > 0") { row in
            columns.append((sqlite3_column_int64(row, 0), sqlite3_column_int(row, 1) + 1))
        }
        return columns.sorted { $0.0 < $1.0 }.map { "\($0.1)" }.joined(separator: ", ")
    }

    /// Hashes one value with its type, so that 1, 1.0, '1' and x'31' all differ.
    private static func hashValue(_ row: OpaquePointer, _ column: Int32, into hash: inout SHA256) {
        switch sqlite3_column_type(row, column) {
        case SQLITE_INTEGER:
            hash.update(data: [UInt8(ascii: "i")] + withUnsafeBytes(of: sqlite3_column_int64(row, column).bigEndian, Array.init))
        case SQLITE_FLOAT:
            hash.update(data: [UInt8(ascii: "f")] + withUnsafeBytes(of: sqlite3_column_double(row, column).bitPattern.bigEndian, Array.init))
        case SQLITE_TEXT, SQLITE_BLOB:
            let tag = sqlite3_column_type(row, column) == SQLITE_TEXT ? UInt8(ascii: "t") : UInt8(ascii: "b")
            let bytes = sqlite3_column_blob(row, column)
            let count = Int(sqlite3_column_bytes(row, column))
            hash.update(data: [tag] + withUnsafeBytes(of: UInt64(count).bigEndian, Array.init))
            if let bytes, count > 0 { hash.update(bufferPointer: UnsafeRawBufferPointer(start: bytes, count: count)) }
        default:
            hash.update(data: [UInt8(ascii: "n")])
        }
    }

    private static func text(_ row: OpaquePointer, _ column: Int32) -> String {
        sqlite3_column_text(row, column).map { String(cString: $0) } ?? ""
    }

    fileprivate static func execute(_ connection: OpaquePointer, _ sql: String) throws {
        try each(connection, sql) { _ in }
    }

    /// Runs `sql` and calls `body` with each row.
    fileprivate static func each(_ connection: OpaquePointer, _ sql: String, _ body: (OpaquePointer) throws -> Void) throws {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(connection, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw Failure(description: String(cString: sqlite3_errmsg(connection)))
        }
        defer { sqlite3_finalize(statement) }
        while true {
            switch sqlite3_step(statement) {
            case SQLITE_ROW: try body(statement)
            case SQLITE_DONE: return
            default: throw Failure(description: String(cString: sqlite3_errmsg(connection)))
            }
        }
    }
}
