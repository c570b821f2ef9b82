import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// `migrations.backupBeforeMigrating: auto` (the default): a store is copied before migrating
/// only when a pending migration can lose data; `always` and `never` keep their meaning.
@Suite struct BackupPolicyTests {
    /// Makes `bob`'s store at version 1 with a row (and `extra` SQL), then adds `pending` as
    /// version 2 and migrates under `mode`. Returns the report and the started event's decision.
    func migrate(pending: String, mode: MigrationPolicy.BackupMode, extra: String = "") async throws -> (report: MigrationReport, decision: BackupDecision?, backups: [String]) {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_notes.sql", "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL);")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            try await harness.registry.withStore(user("bob")) { store in
                try await store.write { db in
                    try db.execute(sql: "INSERT INTO notes (title) VALUES ('kept')")
                    if !extra.isEmpty { try db.execute(sql: extra) }
                }
            }
            await harness.registry.shutdown()
        }
        try folder.write("0002_next.sql", pending)
        let harness = try Harness(directory: directory, migrations: try folder.load(), policy: MigrationPolicy(backupBeforeMigrating: mode))
        let report = try await harness.registry.migrate(user("bob"))
        let decision = harness.recorder.events.compactMap { event -> BackupDecision? in
            if case .migrationStarted(_, _, _, _, let backup) = event { return backup } else { return nil }
        }.first
        let backups = (try? FileManager.default.subpathsOfDirectory(atPath: harness.layout.backupsDirectory))?.filter { $0.hasSuffix(".sqlite") } ?? []
        await harness.registry.shutdown()
        #expect(report.applied == [2])
        return (report, decision, backups)
    }

    @Test func autoTakesNoCopyBeforeAnAdditiveMigration() async throws {
        let result = try await migrate(pending: """
            ALTER TABLE notes ADD COLUMN color TEXT;
            CREATE INDEX notes_by_color ON notes (color);
            CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT);
            """, mode: .auto)
        #expect(result.report.backupPath == nil)
        #expect(result.backups.isEmpty, "\(result.backups)")
        #expect(result.decision == BackupDecision(copy: false, reason: "every pending migration only adds (backupBeforeMigrating: auto)"))
    }

    @Test(arguments: [
        ("ALTER TABLE notes DROP COLUMN title;", "drops a column"),
        ("UPDATE notes SET title = upper(title);", "updates existing rows"),
        ("DELETE FROM notes WHERE id > 10;", "deletes rows"),
        ("CREATE TABLE n2 (id INTEGER PRIMARY KEY, title TEXT NOT NULL CHECK (length(title) < 9));\nINSERT INTO n2 SELECT * FROM notes;\nDROP TABLE notes;\nALTER TABLE n2 RENAME TO notes;", "drops (or rebuilds) a table"),
        ("INSERT OR REPLACE INTO notes (id, title) VALUES (1, 'x');", "replaces existing rows"),
        ("PRAGMA recursive_triggers = ON;", "not a statement known to only add"),
    ])
    func autoCopiesBeforeAMigrationThatCanLoseData(_ sql: String, _ why: String) async throws {
        let result = try await migrate(pending: sql, mode: .auto)
        #expect(result.report.backupPath != nil)
        #expect(result.backups.count == 1, "\(result.backups)")
        #expect(result.decision?.copy == true)
        #expect(result.decision?.reason.hasPrefix("0002_next.sql: ") == true && result.decision?.reason.contains(why) == true, "\(String(describing: result.decision))")
    }

    @Test func aPlainInsertIsCopiedForOnlyWhenTheStoreHasATrigger() async throws {
        let insert = "INSERT INTO notes (title) VALUES ('welcome');"
        #expect(try await migrate(pending: insert, mode: .auto).report.backupPath == nil)
        let withTrigger = try await migrate(pending: insert, mode: .auto,
                                            extra: "CREATE TRIGGER trim AFTER INSERT ON notes BEGIN DELETE FROM notes WHERE id < NEW.id - 100; END")
        #expect(withTrigger.report.backupPath != nil)
        #expect(withTrigger.decision?.reason.contains("trigger") == true)
    }

    @Test func alwaysAndNeverKeepTheirMeaning() async throws {
        let always = try await migrate(pending: "ALTER TABLE notes ADD COLUMN color TEXT;", mode: .always)
        #expect(always.report.backupPath != nil && always.backups.count == 1)
        #expect(always.decision == BackupDecision(copy: true, reason: "backupBeforeMigrating is true"))
        let never = try await migrate(pending: "DELETE FROM notes;", mode: .never)
        #expect(never.report.backupPath == nil && never.backups.isEmpty)
        #expect(never.decision == BackupDecision(copy: false, reason: "backupBeforeMigrating is false"))
    }

    @Test func thePlanSaysWhetherAndWhy() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_notes.sql", "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        _ = try await harness.registry.migrate(user("ann"))
        try folder.write("0002_color.sql", "ALTER TABLE notes ADD COLUMN color TEXT;")
        try folder.write("0003_fix.sql", "UPDATE notes SET color = 'red';")
        harness.registry.reload(migrations: try folder.load())
        let plan = try await harness.registry.plan(user("ann"))
        #expect(plan.steps.map(\.version) == [2, 3])
        #expect(plan.steps.map { $0.dataLossReason == nil } == [true, false])
        #expect(plan.backup == BackupDecision(copy: true, reason: "0003_fix.sql: 'UPDATE notes SET color = 'red'' updates existing rows"))
        await harness.registry.shutdown()
    }

    @Test(arguments: [
        ("CREATE TABLE t (a)", true), ("create temp table t (a)", true), ("CREATE UNIQUE INDEX i ON t (a)", true),
        ("CREATE VIEW v AS SELECT 1", true), ("CREATE VIRTUAL TABLE f USING fts5(a)", true), ("CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; END", true),
        ("ALTER TABLE t ADD COLUMN b", true), ("ALTER TABLE t RENAME TO u", true), ("ALTER TABLE t RENAME COLUMN a TO b", true),
        ("DROP INDEX i", true), ("DROP VIEW IF EXISTS v", true), ("-- a comment\nSELECT 1", true),
        ("ALTER TABLE t DROP COLUMN a", false), ("DROP TABLE t", false), ("DROP TABLE IF EXISTS t", false),
        ("UPDATE t SET a = 1", false), ("DELETE FROM t", false), ("REPLACE INTO t VALUES (1)", false),
        ("INSERT OR REPLACE INTO t VALUES (1)", false), ("INSERT INTO t VALUES (1) ON CONFLICT (a) DO UPDATE SET a = 2", false),
        ("WITH x AS (SELECT 1) DELETE FROM t", false), ("PRAGMA foo = 1", false), ("VACUUM", false),
    ])
    func statementsAreClassified(_ sql: String, _ onlyAdds: Bool) {
        switch DataLossClassifier.effect(of: sql) {
        case .additive, .insertsRows: #expect(onlyAdds, "\(sql)")
        case .canLoseData: #expect(!onlyAdds, "\(sql)")
        }
    }
}

/// Backups go into one folder level (`backups/ab/`); copies earlier versions kept in
/// `backups/ab/cd/` are still found, pruned and deleted.
@Suite struct BackupLayoutTests {
    @Test func newCopiesUseOneLevelAndOldOnesAreStillFound() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_notes.sql", "CREATE TABLE notes (id INTEGER PRIMARY KEY);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let bob = user("bob")
        _ = try await harness.registry.migrate(bob)
        let fresh = try await harness.registry.backup(bob)
        let prefix = StoreLayout.hashPrefix(of: bob)
        #expect(fresh.hasPrefix(harness.layout.backupsDirectory + "/" + prefix.prefix(2) + "/bob.v1."), "\(fresh)")

        let legacyFolder = harness.layout.backupsDirectory + "/" + prefix
        try FileManager.default.createDirectory(atPath: legacyFolder, withIntermediateDirectories: true)
        let legacy = legacyFolder + "/" + BackupKeeper.fileName(user: bob, schemaVersion: 1, reason: .beforeMigration, at: Date(timeIntervalSince1970: 1_700_000_000))
        try FileManager.default.copyItem(atPath: fresh, toPath: legacy)
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSince1970: 1_700_000_000)], ofItemAtPath: legacy)
        let keeper = BackupKeeper(layout: harness.layout)
        #expect(keeper.list(user: bob) == [legacy, fresh])
        #expect(StoreFiles(layout: harness.layout).files(of: bob, keepBackups: false).contains(legacy))
        keeper.prune(user: bob, olderThanSeconds: 3600) // the 2023 before-migration copy is old; the manual one stays
        #expect(keeper.list(user: bob) == [fresh])
        await harness.registry.shutdown()
    }
}
