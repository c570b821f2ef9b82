import GRDB
import GRDBSQLite

/// The daemon's own tables inside every store, and the only code that reads or writes them.
///
/// - `app_version`: exactly one row (`id = 1`): the app version that last opened or migrated the
///   store, its schema version, the app version that created it, timestamps, and the
///   fingerprint of the applied versions (so a current store is recognised from this one row).
/// - `schema_migrations`: one row per applied migration.
/// - `PRAGMA user_version`: equal to `app_version.schema_version`.
enum Bookkeeping {
    /// The tables the daemon owns (lower-case); clients may read them, never change them.
    static let tables: Set<String> = ["app_version", "schema_migrations", "userstore_watch", "userstore_changes"]
    /// Tables Litestream creates in every store it replicates; not the app's schema.
    static let replicatorPrefix = "_litestream_"

    static let createTables = """
        CREATE TABLE app_version (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            app_version TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            created_by_app_version TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            migrations_fingerprint TEXT NOT NULL,
            schema_hash TEXT
        );
        CREATE TABLE schema_migrations (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            checksum TEXT NOT NULL,
            applied_at TEXT NOT NULL,
            duration_usec INTEGER NOT NULL,
            app_version TEXT NOT NULL,
            skipped INTEGER NOT NULL DEFAULT 0,
            down_sql TEXT
        );
        """

    /// ISO-8601 UTC with milliseconds, computed by SQLite so every row uses one clock format.
    static let now = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"

    /// `PRAGMA user_version`.
    static func userVersion(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db, sql: "PRAGMA user_version") ?? 0
    }

    /// Whether the bookkeeping tables exist.
    static func exists(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'app_version')") ?? false
    }

    /// The `app_version` row; nil when the table does not exist yet.
    static func read(_ db: Database) throws -> StoreVersionInfo? {
        try read(connection: db.sqliteConnection!)
    }

    /// ``read(_:)`` on the raw connection, so that it also serves ``Store/runIfIdle(_:)``:
    /// GRDB's `Database` cannot be reached from there without a synchronous hop to the store's
    /// queue, which may be waiting for the connection lock the caller holds.
    static func read(connection: OpaquePointer) throws -> StoreVersionInfo? {
        let exists = try firstRow(connection, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'app_version'") { _ in true }
        guard exists == true else { return nil }
        let sql = """
            SELECT app_version, schema_version, created_by_app_version, created_at, updated_at,
                   migrations_fingerprint, schema_hash FROM app_version WHERE id = 1
            """
        return try firstRow(connection, sql) { row in
            func text(_ column: Int32) -> String? { sqlite3_column_text(row, column).map { String(cString: $0) } }
            return StoreVersionInfo(
                appVersion: text(0) ?? "", schemaVersion: sqlite3_column_int64(row, 1), createdByAppVersion: text(2) ?? "",
                createdAt: text(3) ?? "", updatedAt: text(4) ?? "", migrationsFingerprint: text(5) ?? "", schemaHash: text(6))
        }
    }

    /// Runs `sql` and hands its first row to `body`; nil when there is none.
    private static func firstRow<T>(_ connection: OpaquePointer, _ sql: String, _ body: (OpaquePointer) -> T) throws -> T? {
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        var code = sqlite3_prepare_v2(connection, sql, -1, &statement, nil)
        if code == SQLITE_OK, let statement {
            code = sqlite3_step(statement)
            if code == SQLITE_ROW { return body(statement) }
            if code == SQLITE_DONE { return nil }
        }
        throw DatabaseError(resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(connection)), sql: sql)
    }

    /// Creates the tables and the single row of a new store (schema version 0), created by
    /// `appVersion` (or `createdBy`: `imported` for a file brought in by `ImportStore`).
    static func initialise(_ db: Database, appVersion: AppVersion, createdBy: String? = nil) throws {
        try db.execute(sql: createTables)
        try db.execute(sql: """
            INSERT INTO app_version (id, app_version, schema_version, created_by_app_version,
                                     created_at, updated_at, migrations_fingerprint)
            VALUES (1, ?, 0, ?, \(now), \(now), ?)
            """, arguments: [appVersion.text, createdBy ?? appVersion.text, MigrationSet.versionsFingerprint([])])
    }

    /// The `app_version` of migrations recorded by an import: the file already had their schema.
    static let importedMarker = "imported"

    /// Records `migration` as applied by an import (its SQL was not run here).
    static func recordImported(_ db: Database, _ migration: Migration) throws {
        try db.execute(sql: """
            INSERT INTO schema_migrations (version, name, checksum, applied_at, duration_usec, app_version, skipped, down_sql)
            VALUES (?, ?, ?, \(now), 0, ?, 0, ?)
            """, arguments: [migration.version, migration.name, migration.checksum, importedMarker, migration.down?.joined(separator: "\n")])
    }

    /// Stamps the creation time of a store copied from the template (the copy carries the
    /// template's).
    ///
    /// Without fsync: the copy itself is durable (`StoreTemplate.install`); if a crash loses
    /// this one transaction (WAL frames are checksummed, a torn one is ignored), the store
    /// keeps the template's time — while syncing it would double the cost of creating a store.
    static func stampCreation(_ db: Database) throws {
        try db.execute(sql: "PRAGMA synchronous = OFF")
        defer { try? db.execute(sql: "PRAGMA synchronous = FULL") }
        try db.execute(sql: "UPDATE app_version SET created_at = \(now), updated_at = \(now) WHERE id = 1")
    }

    /// Every applied migration, ascending.
    static func applied(_ db: Database) throws -> [AppliedMigration] {
        try Row.fetchAll(db, sql: """
            SELECT version, name, checksum, applied_at, duration_usec, app_version, skipped, down_sql
            FROM schema_migrations ORDER BY version
            """).map { row in
            AppliedMigration(version: row[0], name: row[1], checksum: row[2], appliedAt: row[3],
                             durationMicroseconds: row[4], appVersion: row[5], skipped: row[6], downSQL: row[7])
        }
    }

    /// Whether `version` is recorded as applied.
    static func isApplied(_ db: Database, version: Int64) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?)"), arguments: [version]) ?? false
    }

    /// Records `migration` as applied (and, for a `-- Compatible` one, that older daemons may
    /// serve the store past it).
    static func recordApplied(_ db: Database, _ migration: Migration, durationMicroseconds: Int64, appVersion: AppVersion, skipped: Bool) throws {
        try db.cachedStatement(sql: """
            INSERT INTO schema_migrations (version, name, checksum, applied_at, duration_usec, app_version, skipped, down_sql)
            VALUES (?, ?, ?, \(now), ?, ?, ?, ?)
            """).execute(arguments: [migration.version, migration.name, migration.checksum, durationMicroseconds,
                             appVersion.text, skipped, migration.down?.joined(separator: "\n")])
        if migration.compatible {
            // The column exists only in stores that ever applied a compatible migration: older
            // daemons read the table without it.
            if try !hasCompatibleColumn(db) {
                try db.execute(sql: "ALTER TABLE schema_migrations ADD COLUMN compatible INTEGER NOT NULL DEFAULT 0")
            }
            try db.execute(sql: "UPDATE schema_migrations SET compatible = 1 WHERE version = ?", arguments: [migration.version])
        }
    }

    /// The applied versions above `version`, each with whether it was marked `-- Compatible`
    /// when applied.
    static func applied(above version: Int64, _ db: Database) throws -> [(version: Int64, compatible: Bool)] {
        let compatible = try hasCompatibleColumn(db) ? "compatible" : "0"
        return try Row.fetchAll(db, sql: "SELECT version, \(compatible) FROM schema_migrations WHERE version > ? ORDER BY version",
                                arguments: [version]).map { ($0[0], $0[1]) }
    }

    private static func hasCompatibleColumn(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM pragma_table_info('schema_migrations') WHERE name = 'compatible')") ?? false
    }

    /// Sets `user_version`, the row's schema version and fingerprint from `schema_migrations`
    /// (or from `versions`, the rows it holds now, when the caller knows them: a migration
    /// that changed the schema makes SQLite prepare the query again), and (when given) the app
    /// version that last touched the store.
    static func syncVersion(_ db: Database, appVersion: AppVersion?, versions known: [Int64]? = nil) throws -> Int64 {
        let versions = try known ?? Int64.fetchAll(db.cachedStatement(sql: "SELECT version FROM schema_migrations"))
        let schemaVersion = versions.max() ?? 0
        try db.execute(sql: "PRAGMA user_version = \(schemaVersion)")
        try db.cachedStatement(sql: """
            UPDATE app_version SET schema_version = ?, migrations_fingerprint = ?,
                   app_version = coalesce(?, app_version), updated_at = \(now)
            WHERE id = 1
            """).execute(arguments: [schemaVersion, MigrationSet.versionsFingerprint(versions), appVersion?.text])
        return schemaVersion
    }

    /// Records the hash of the desired schema the store was reconciled with.
    static func recordSchemaHash(_ db: Database, _ hash: String?) throws {
        try db.execute(sql: "UPDATE app_version SET schema_hash = ?, updated_at = \(now) WHERE id = 1", arguments: [hash])
    }

    /// Replaces the recorded checksum of `version` (accepting a changed file).
    static func acceptChecksum(_ db: Database, version: Int64, checksum: String) throws {
        try db.execute(sql: "UPDATE schema_migrations SET checksum = ? WHERE version = ?", arguments: [checksum, version])
    }
}

/// The `app_version` row of a store.
public struct StoreVersionInfo: Sendable, Equatable, Codable {
    /// The app version that last opened or migrated the store.
    public var appVersion: String
    /// The schema version (`PRAGMA user_version`).
    public var schemaVersion: Int64
    /// The app version that created the store.
    public var createdByAppVersion: String
    /// When the store was created (ISO-8601 UTC).
    public var createdAt: String
    /// When the row last changed (ISO-8601 UTC).
    public var updatedAt: String
    /// Fingerprint of the applied versions.
    public var migrationsFingerprint: String
    /// Hash of the declarative schema last reconciled, if any.
    public var schemaHash: String?
}

/// One row of `schema_migrations`.
public struct AppliedMigration: Sendable, Equatable, Codable {
    public var version: Int64
    public var name: String
    public var checksum: String
    public var appliedAt: String
    public var durationMicroseconds: Int64
    public var appVersion: String
    /// True when app-version gating skipped the migration's SQL on this store.
    public var skipped: Bool
    /// The Down section as it was when applied, so a rollback works even once the file is gone.
    public var downSQL: String?
}
