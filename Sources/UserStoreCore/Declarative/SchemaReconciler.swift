import Foundation
import GRDB

/// What reconciling a store with the desired schema would run.
public struct ReconcilePlan: Sendable, Equatable {
    /// The statements, in order; run in one transaction with foreign keys off before it and
    /// `PRAGMA foreign_key_check` before commit, like a numbered migration.
    public var statements: [String]
    /// Changes that lose data (dropped tables, dropped columns that hold data); refused unless allowed.
    public var destructive: [String]

    public var isEmpty: Bool { statements.isEmpty }
}

/// Compares a store's schema with a desired schema (a `schema.sql` of CREATE TABLE / INDEX /
/// VIEW / TRIGGER statements) and plans the difference:
///
/// - new tables, indexes, views, triggers: CREATE;
/// - a new column SQLite can add in place: `ALTER TABLE … ADD COLUMN`;
/// - anything else about a table (a dropped or changed column, a changed constraint, default,
///   collation, CHECK, foreign key, WITHOUT ROWID/STRICT): SQLite's 12-step rebuild — create the
///   new table under a temporary name, copy every row (the new columns' affinity converts values,
///   text '12' becomes integer 12 in an INTEGER column), drop the old table, rename the new one,
///   recreate its indexes and triggers and every view, keep the AUTOINCREMENT counter;
/// - removed indexes, views, triggers: DROP; removed tables: DROP (destructive).
///
/// Renames are declared, never guessed: `-- renamed from: old` on a column's line or on the
/// CREATE TABLE line. Plans are deterministic: the same store and schema give the same SQL.
struct SchemaReconciler {
    let desired: SchemaSnapshot

    func plan(_ db: Database) throws -> ReconcilePlan {
        var live = try SchemaSnapshot.read(db)
        var statements: [String] = []
        var destructive: [String] = []

        // Declared table renames. SQLite rewrites the table's indexes and triggers itself, so the
        // live snapshot's copies are renamed the same way (else they would be dropped and made again).
        for name in desired.tableOrder {
            guard let table = desired.tables[name], let old = table.renamedFrom, live.tables[name] == nil, var renamed = live.tables[old] else { continue }
            statements.append("ALTER TABLE \(quote(old)) RENAME TO \(quote(name));")
            renamed.name = name
            live.tables[old] = nil
            live.tables[name] = renamed
            live.tableOrder = live.tableOrder.map { $0 == old ? name : $0 }
            live.rename(table: old, to: name)
        }

        var created: [String] = [], added: [String] = [], rebuilt: [String] = []
        var rebuilds: [[String]] = []
        for name in desired.tableOrder {
            if let opaque = desired.opaqueTables[name] {
                if live.opaqueTables[name]?.normalized != opaque.normalized {
                    if live.opaqueTables[name] != nil { statements.append("DROP TABLE \(quote(name));") }
                    created.append(opaque.sql + ";")
                }
                continue
            }
            guard let target = desired.tables[name] else { continue }
            guard var current = live.tables[name] else {
                created.append(target.sql + ";")
                continue
            }
            // Declared column renames.
            for column in target.columns {
                guard let old = column.renamedFrom, current.column(column.name) == nil, let index = current.columns.firstIndex(where: { $0.name == old }) else { continue }
                statements.append("ALTER TABLE \(quote(name)) RENAME COLUMN \(quote(old)) TO \(quote(column.name));")
                current.columns[index].name = column.name
                live.rename(column: old, to: column.name, in: name)
            }
            if target.sameShape(as: current) { continue }
            let newColumns = target.columns.filter { current.column($0.name) == nil }
            let removed = current.columns.filter { target.column($0.name) == nil }
            let changed = target.columns.filter { column in current.column(column.name).map { $0.definition != column.definition } ?? false }
            if removed.isEmpty, changed.isEmpty, Set(target.constraints) == Set(current.constraints), target.options == current.options,
               newColumns.allSatisfy(Self.canAddInPlace) {
                added += newColumns.map { "ALTER TABLE \(quote(name)) ADD COLUMN \($0.sql);" }
                continue
            }
            for column in removed {
                let values = try Int.fetchOne(db, sql: "SELECT count(*) FROM \(quote(name)) WHERE \(quote(column.name)) IS NOT NULL") ?? 0
                if values > 0 { destructive.append("drops column \(name).\(column.name), which holds data in \(values) row\(values == 1 ? "" : "s")") }
            }
            rebuilt.append(name)
            rebuilds.append(try rebuild(db, current: current, target: target))
        }
        var droppedTables: [String] = []
        for name in live.tableOrder where desired.tables[name] == nil && desired.opaqueTables[name] == nil {
            let rows = (try? Int.fetchOne(db, sql: "SELECT count(*) FROM \(quote(name))")) ?? 0
            destructive.append("drops table \(name) (\(rows) row\(rows == 1 ? "" : "s"))")
            droppedTables.append("DROP TABLE \(quote(name));")
        }

        // Views may name any rebuilt table, so with a rebuild every view is dropped and recreated.
        let recreateAllViews = !rebuilt.isEmpty || !droppedTables.isEmpty
        var dropViews: [String] = [], createViews: [String] = []
        for (name, view) in live.views.sorted(by: { $0.key < $1.key }) where recreateAllViews || desired.views[name]?.normalized != view.normalized {
            dropViews.append("DROP VIEW \(quote(name));")
        }
        // Views in name order: SQLite resolves a view's dependencies when it is used, not created.
        for (name, view) in desired.views.sorted(by: { $0.key < $1.key }) where recreateAllViews || live.views[name]?.normalized != view.normalized {
            createViews.append(view.sql + ";")
        }
        let (dropIndexes, createIndexes) = Self.diff(live: live.indexes, desired: desired.indexes, rebuilt: rebuilt, kind: "INDEX")
        let (dropTriggers, createTriggers) = Self.diff(live: live.triggers, desired: desired.triggers, rebuilt: rebuilt, kind: "TRIGGER")

        let ordered = dropViews + dropTriggers + dropIndexes + statements + created + added + rebuilds.flatMap { $0 }
            + droppedTables + createIndexes + createTriggers + createViews
        return ReconcilePlan(statements: ordered, destructive: destructive)
    }

    /// SQLite's 12-step procedure for `current` → `target` (steps 1, 2, 10, 11 and 12 — foreign
    /// keys off before the transaction, BEGIN, foreign_key_check, COMMIT, foreign keys on — are
    /// the migration engine's). The old table is never renamed first.
    private func rebuild(_ db: Database, current: TableDefinition, target: TableDefinition) throws -> [String] {
        let name = target.name
        let temporary = "_userstore_new_" + name
        let copied = target.columns.filter { current.column($0.name) != nil && !Self.isGenerated($0) }.map { quote($0.name) }.joined(separator: ", ")
        var steps = [target.sql(renamedTo: temporary) + ";"]
        if !copied.isEmpty {
            steps.append("INSERT INTO \(quote(temporary)) (\(copied)) SELECT \(copied) FROM \(quote(name));")
        }
        steps += ["DROP TABLE \(quote(name));", "ALTER TABLE \(quote(temporary)) RENAME TO \(quote(name));"]
        // Keep the AUTOINCREMENT counter: DROP TABLE forgot it, and the copy only raised it to
        // the largest rowid left, so ids of deleted rows would be handed out again.
        let hasSequence = try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence')") ?? false
        if hasSequence, let sequence = try Int64.fetchOne(db, sql: "SELECT seq FROM sqlite_sequence WHERE name = ?", arguments: [name]),
           target.sql.lowercased().contains("autoincrement") {
            let literal = "'" + name.replacingOccurrences(of: "'", with: "''") + "'"
            steps.append("UPDATE sqlite_sequence SET seq = max(seq, \(sequence)) WHERE name = \(literal);")
            steps.append("INSERT INTO sqlite_sequence (name, seq) SELECT \(literal), \(sequence) WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = \(literal));")
        }
        return steps
    }

    /// Drops and creates for indexes or triggers; those of rebuilt tables went with the table
    /// and are all created again.
    private static func diff(live: [String: SchemaSnapshot.Object], desired: [String: SchemaSnapshot.Object], rebuilt: [String], kind: String) -> ([String], [String]) {
        var drops: [String] = [], creates: [String] = []
        for (name, object) in live.sorted(by: { $0.key < $1.key }) where !rebuilt.contains(object.table) && desired[name]?.normalized != object.normalized {
            drops.append("DROP \(kind) \(quote(name));")
        }
        for (name, object) in desired.sorted(by: { $0.key < $1.key }) where rebuilt.contains(object.table) || live[name]?.normalized != object.normalized {
            creates.append(object.sql + ";")
        }
        return (drops, creates)
    }

    /// What ALTER TABLE ADD COLUMN accepts: no PRIMARY KEY or UNIQUE, NOT NULL only with a
    /// constant non-NULL default, no non-constant default, no stored generated column, no
    /// REFERENCES with a non-NULL default.
    static func canAddInPlace(_ column: TableDefinition.Column) -> Bool {
        let words = column.definition.split(separator: " ").map(String.init)
        if words.contains("primary") || words.contains("unique") || isGenerated(column) { return false }
        let defaultIndex = words.firstIndex(of: "default")
        let defaultValue = defaultIndex.flatMap { $0 + 1 < words.count ? words[$0 + 1] : nil }
        if let value = defaultValue, ["(", "current_time", "current_date", "current_timestamp"].contains(value) { return false }
        let notNull = zip(words, words.dropFirst()).contains { $0 == "not" && $1 == "null" }
        if notNull, defaultValue == nil || defaultValue == "null" { return false }
        if words.contains("references"), let value = defaultValue, value != "null" { return false }
        return true
    }

    static func isGenerated(_ column: TableDefinition.Column) -> Bool {
        let words = column.definition.split(separator: " ")
        return words.contains("generated") || zip(words, words.dropFirst()).contains { $0 == "as" && $1 == "(" }
    }
}
