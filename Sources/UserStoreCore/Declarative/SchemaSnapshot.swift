import GRDB

/// The user-visible schema of a database (the daemon's bookkeeping and SQLite's internal tables
/// excluded), read from `sqlite_schema`.
struct SchemaSnapshot: Sendable, Equatable {
    /// An index, view or trigger: compared by its normalised SQL.
    struct Object: Sendable, Equatable {
        var name: String
        var table: String
        var sql: String
        var normalized: String
    }

    var tables: [String: TableDefinition] = [:]
    /// Tables SQLite cannot take apart here (virtual tables, CREATE TABLE AS): compared by SQL.
    var opaqueTables: [String: Object] = [:]
    var indexes: [String: Object] = [:]
    var views: [String: Object] = [:]
    var triggers: [String: Object] = [:]
    /// Table names in creation order (for deterministic plans).
    var tableOrder: [String] = []

    /// Follows `ALTER TABLE old RENAME TO new` in the indexes and triggers of the table.
    mutating func rename(table old: String, to new: String) {
        for key in indexes.keys where indexes[key]!.table == old {
            indexes[key]!.table = new
            indexes[key]!.normalized = Self.replacing(token: old, with: new, in: indexes[key]!.normalized)
        }
        for key in triggers.keys where triggers[key]!.table == old {
            triggers[key]!.table = new
            triggers[key]!.normalized = Self.replacing(token: old, with: new, in: triggers[key]!.normalized)
        }
    }

    /// Follows `ALTER TABLE t RENAME COLUMN old TO new` in the indexes of the table.
    mutating func rename(column old: String, to new: String, in table: String) {
        for key in indexes.keys where indexes[key]!.table == table {
            indexes[key]!.normalized = Self.replacing(token: old, with: new, in: indexes[key]!.normalized)
        }
    }

    private static func replacing(token: String, with replacement: String, in normalized: String) -> String {
        normalized.split(separator: " ").map { $0 == token ? replacement : String($0) }.joined(separator: " ")
    }

    static func read(_ db: Database) throws -> SchemaSnapshot {
        var snapshot = SchemaSnapshot()
        let rows = try Row.fetchAll(db, sql: """
            SELECT type, name, tbl_name, sql FROM sqlite_master
            WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid
            """)
        for row in rows {
            let type: String = row[0], name: String = row[1], table: String = row[2], sql: String = row[3]
            let key = name.lowercased(), tableKey = table.lowercased()
            if Bookkeeping.tables.contains(tableKey) || tableKey.hasPrefix(Bookkeeping.replicatorPrefix) { continue }
            let object = Object(name: key, table: tableKey, sql: sql, normalized: SQLTokenizer.normalized(SQLTokenizer.tokens(sql)))
            switch type {
            case "table":
                snapshot.tableOrder.append(key)
                if let definition = TableDefinition.parse(sql) { snapshot.tables[key] = definition } else { snapshot.opaqueTables[key] = object }
            case "index": snapshot.indexes[key] = object
            case "view": snapshot.views[key] = object
            case "trigger": snapshot.triggers[key] = object
            default: break
            }
        }
        return snapshot
    }

    /// The snapshot of `sql` (a desired schema) built in a pristine in-memory database.
    static func desired(_ sql: String) throws -> SchemaSnapshot {
        let queue = try DatabaseQueue()
        return try queue.writeWithoutTransaction { db in
            try db.execute(sql: sql)
            return try read(db)
        }
    }
}
