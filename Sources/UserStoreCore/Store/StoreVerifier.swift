import GRDB

/// The result of ``StoreRegistry/verify(_:)``.
public struct VerificationReport: Sendable, Equatable, Codable {
    public var user: String
    public var schemaVersion: Int64
    /// Known migrations not applied yet.
    public var pending: [Int64]
    /// Everything wrong, one sentence each; empty when the store is sound.
    public var problems: [String]

    /// True when nothing is wrong.
    public var ok: Bool { problems.isEmpty }
}

/// Reads a store and lists what is wrong with it. Never writes.
struct StoreVerifier {
    let user: UserID
    let migrations: MigrationSet

    func verify(_ db: Database) throws -> VerificationReport {
        var problems: [String] = []
        let integrity = try String.fetchAll(db, sql: "PRAGMA integrity_check")
        if integrity != ["ok"] { problems += integrity.prefix(10).map { "integrity_check: \($0)" } }
        let violations = try Row.fetchAll(db, sql: "SELECT \"table\", rowid, parent FROM pragma_foreign_key_check LIMIT 10")
        for violation in violations {
            let table: String = violation[0], parent: String = violation[2]
            let rowid: Int64? = violation[1]
            problems.append("foreign_key_check: row \(rowid.map(String.init) ?? "?") of \(table) references a missing row of \(parent)")
        }
        let userVersion = try Bookkeeping.userVersion(db)
        guard let info = try Bookkeeping.read(db) else {
            problems.append("bookkeeping: the app_version table or its row is missing")
            return VerificationReport(user: user.rawValue, schemaVersion: userVersion, pending: migrations.migrations.map(\.version), problems: problems)
        }
        let applied = try Bookkeeping.applied(db)
        let maxApplied = applied.map(\.version).max() ?? 0
        if info.schemaVersion != userVersion {
            problems.append("bookkeeping: app_version.schema_version is \(info.schemaVersion) but user_version is \(userVersion)")
        }
        if maxApplied != userVersion {
            problems.append("bookkeeping: the latest applied migration is \(maxApplied) but user_version is \(userVersion)")
        }
        if info.migrationsFingerprint != MigrationSet.versionsFingerprint(applied.map(\.version)) {
            problems.append("bookkeeping: app_version.migrations_fingerprint does not match schema_migrations")
        }
        if userVersion > migrations.latestVersion {
            problems.append("schema version \(userVersion) is newer than the latest known migration \(migrations.latestVersion)")
        }
        for row in applied {
            guard let known = migrations.migration(version: row.version) else {
                problems.append("migration \(row.version) (\(row.name)) is applied but its file is gone")
                continue
            }
            if known.checksum != row.checksum {
                problems.append("migration \(row.version) (\(known.fileName)) changed after it was applied (checksum)")
            }
        }
        let appliedVersions = Set(applied.map(\.version))
        let pending = migrations.migrations.map(\.version).filter { !appliedVersions.contains($0) }
        return VerificationReport(user: user.rawValue, schemaVersion: userVersion, pending: pending, problems: problems)
    }
}
