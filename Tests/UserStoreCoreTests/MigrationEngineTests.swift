import CSyncFS
import Foundation
import Synchronization
import GRDB
import Testing
@testable import UserStoreCore

@Suite struct MigrationEngineTests {
    @Test func newStoreGetsEveryMigrationWithExactBookkeeping() async throws {
        let directory = try TemporaryDirectory()
        let migrations = try MigrationSet.load(directory: exampleMigrationsDirectory)
        let harness = try Harness(directory: directory, migrations: migrations, appVersion: "2.0.1")
        let info = try await harness.registry.info(user("alice"))
        #expect(info.schemaVersion == 6)
        #expect(info.appVersion == "2.0.1")
        #expect(info.createdByAppVersion == "2.0.1")
        await harness.registry.shutdown()

        try harness.inspect("alice") { (db: Database) throws in
            let snapshot = try BookkeepingSnapshot.read(db)
            #expect(snapshot == BookkeepingSnapshot(userVersion: 6, schemaVersion: 6, appVersion: "2.0.1", createdBy: "2.0.1",
                                                    migrations: [1, 2, 3, 4, 5, 6],
                                                    names: ["notes", "tags", "pinned", "notes_by_date", "trim_titles", "title_limit"]))
            #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM app_version") == 1)
            let checksums = try String.fetchAll(db, sql: "SELECT checksum FROM schema_migrations ORDER BY version")
            #expect(checksums == migrations.migrations.map(\.checksum))
            // Created by 2.0.1, so the "below 1.3" data fix was recorded as skipped.
            #expect(try Int64.fetchAll(db, sql: "SELECT version FROM schema_migrations WHERE skipped") == [5])
            #expect(try String.fetchOne(db, sql: "PRAGMA journal_mode") == "wal")
            #expect(try Bool.fetchOne(db, sql: "SELECT count(*) = 6 FROM schema_migrations WHERE applied_at LIKE '20__-__-__T__:__:__.___Z' AND app_version = '2.0.1'") == true)
        }
        #expect(harness.recorder.count { if case .storeCreated = $0 { true } else { false } } == 1)
        #expect(harness.recorder.count { if case .migrationStep = $0 { true } else { false } } == 6)
        #expect(harness.layout.allUsers() == [user("alice")])
    }

    /// `.checkpoint` and `.shared` (a fleet run's stores) commit without fsync and end with a
    /// checkpoint: once the run returns, its changes are in the database file itself, not only
    /// in the WAL. `.lastCommit` leaves them in the WAL (durable there) until a later checkpoint.
    @Test func aCheckpointedRunLeavesItsChangesInTheDatabaseFileItself() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_log.sql", "CREATE TABLE log (step INTEGER);")
        try await Harness.seed([user("lastcommit"), user("checkpoint"), user("shared")], in: directory, migrations: try folder.load())
        for step in 2...4 { try folder.write("000\(step)_step\(step).sql", "INSERT INTO log VALUES (\(step));") }
        let harness = try Harness(directory: directory, migrations: try folder.load())
        // What the database file alone holds at each shared sync: the first must come before the
        // checkpoint (the WAL made durable while the file still holds version 1), the second after.
        let sharedPath = harness.layout.storePath(for: user("shared"))
        let seen = Mutex<[Int64]>([])
        let fileSystem = FileSystemSync(directory: directory.path) { descriptor in
            seen.withLock { seen in
                let copy = directory.path + "/at-sync-\(seen.count).sqlite"
                seen.append(Self.versionInMainFile(sharedPath, copyTo: copy))
            }
            return syncfs(descriptor)
        }
        let runs: [(String, Migrator.Durability, Int64)] = [("lastcommit", .lastCommit, 1), ("checkpoint", .checkpoint, 4), ("shared", .shared(fileSystem), 4)]
        for (name, durability, expected) in runs {
            let path = harness.layout.storePath(for: user(name))
            let queue = try DatabaseQueue(path: path)
            let migrator = harness.registry.preparer.makeMigrator(user(name), migrations: try folder.load(), durability: durability)
            let report = try await queue.writeWithoutTransaction { db in try migrator.migrate(db, created: false) }
            #expect(report.fromVersion == 1 && report.applied == [2, 3, 4])
            #expect(try await queue.read { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") } == 2, "back to FULL")
            // The database file alone, without its WAL, while the connection is still open.
            let inFile = Self.versionInMainFile(path, copyTo: directory.path + "/\(name)-main-file.sqlite")
            #expect(inFile == expected, "\(name): the database file holds version \(inFile)")
            try queue.close()
        }
        #expect(seen.withLock { $0 } == [1, 4], "the database file at the shared syncs")
    }

    /// A `.shared` run writes nothing to the database file before its first shared sync, even
    /// when its migration fills more of the WAL than SQLite's automatic checkpoint allows
    /// (1,000 pages): under synchronous=OFF that checkpoint would copy unsynced frames into the
    /// file. The file is byte for byte as before at the first sync; migrated after the run.
    @Test func aSharedRunLeavesTheDatabaseFileAloneUntilItsFirstSync() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_log.sql", "CREATE TABLE log (step INTEGER);")
        try await Harness.seed([user("big")], in: directory, migrations: try folder.load())
        // ~8 MB of rows: 2,000 pages of WAL, twice the automatic checkpoint's threshold.
        try folder.write("0002_fill.sql", """
            CREATE TABLE blobs (data BLOB);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO blobs SELECT randomblob(4000) FROM n;
            """)
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let path = harness.layout.storePath(for: user("big"))
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let unchangedAtFirstSync = Mutex<Bool?>(nil)
        let fileSystem = FileSystemSync(directory: directory.path) { descriptor in
            unchangedAtFirstSync.withLock { seen in
                if seen == nil { seen = (try? Data(contentsOf: URL(fileURLWithPath: path))) == before }
            }
            return syncfs(descriptor)
        }
        let queue = try DatabaseQueue(path: path)
        let migrator = harness.registry.preparer.makeMigrator(user("big"), migrations: try folder.load(), durability: .shared(fileSystem))
        let report = try await queue.writeWithoutTransaction { db in try migrator.migrate(db, created: false) }
        #expect(report.applied == [2])
        #expect(unchangedAtFirstSync.withLock { $0 } == true, "the database file changed before the first sync")
        #expect(try await queue.read { db in try Int.fetchOne(db, sql: "PRAGMA wal_autocheckpoint") } == 1000, "restored after the run")
        try queue.close()
        #expect(Self.versionInMainFile(path, copyTo: directory.path + "/big-copy.sqlite") == 2)
    }

    /// A `.shared` run that creates a store switches it to WAL before it stops syncing: that
    /// switch writes the new file's page 1 through a rollback journal, which under
    /// synchronous=OFF a power cut could leave torn (the store then refused as damaged).
    @Test func aSharedRunSwitchesANewStoreToWALWhileStillSyncing() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_log.sql", "CREATE TABLE log (step INTEGER);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let queue = try DatabaseQueue(path: directory.path + "/new.sqlite")
        let statements = Mutex<[String]>([])
        let migrator = harness.registry.preparer.makeMigrator(user("new"), migrations: try folder.load(),
                                                     durability: .shared(FileSystemSync(directory: directory.path)))
        let report = try await queue.writeWithoutTransaction { db in
            db.trace { event in statements.withLock { $0.append("\(event)") } }
            return try migrator.migrate(db, created: true)
        }
        #expect(report.applied == [1])
        let trace = statements.withLock { $0 }
        let walSwitch = try #require(trace.firstIndex(of: "PRAGMA journal_mode = WAL"), "\(trace)")
        let syncOff = try #require(trace.firstIndex(of: "PRAGMA synchronous = OFF"), "\(trace)")
        #expect(walSwitch < syncOff, "\(trace)")
        try queue.close()
    }

    /// `PRAGMA user_version` of a copy of `path`'s main file alone (no WAL); -1 if unreadable.
    private static func versionInMainFile(_ path: String, copyTo copy: String) -> Int64 {
        do {
            try? FileManager.default.removeItem(atPath: copy)
            try FileManager.default.copyItem(atPath: path, toPath: copy)
            return try DatabaseQueue(path: copy).read { db in try Int64.fetchOne(db, sql: "PRAGMA user_version") } ?? -1
        } catch {
            return -1
        }
    }

    @Test func storeSeveralVersionsBehindIsBroughtUpInOrderInOneGo() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_log.sql", "CREATE TABLE log (step INTEGER);\nINSERT INTO log VALUES (1);")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "1.0")
            #expect(try await harness.registry.info(user("bob")).schemaVersion == 1)
            try await harness.registry.withStore(user("bob")) { store in
                try await store.write { db in try db.execute(sql: "INSERT INTO log VALUES (100)") }
            }
            await harness.registry.shutdown()
        }
        for step in 2...5 { try folder.write("000\(step)_step\(step).sql", "INSERT INTO log VALUES (\(step));") }
        let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "1.5")
        let report = try await harness.registry.migrate(user("bob"))
        #expect(report.fromVersion == 1 && report.toVersion == 5 && report.applied == [2, 3, 4, 5])
        // Plain INSERTs into a store without triggers only add: backupBeforeMigrating's
        // default (auto) takes no copy (BackupPolicyTests covers the rule).
        #expect(report.backupPath == nil)
        // The run commits without fsync until its last step; the connection is back to FULL.
        #expect(try await harness.registry.withStore(user("bob")) { store in
            try await store.read { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") }
        } == 2)
        await harness.registry.shutdown()
        try harness.inspect("bob") { (db: Database) throws in
            #expect(try Int.fetchAll(db, sql: "SELECT step FROM log ORDER BY rowid") == [1, 100, 2, 3, 4, 5])
            let snapshot = try BookkeepingSnapshot.read(db)
            #expect(snapshot.userVersion == 5 && snapshot.schemaVersion == 5 && snapshot.appVersion == "1.5" && snapshot.createdBy == "1.0")
        }
        let started = harness.recorder.events.compactMap { event -> (Int64, Int64, Int)? in
            if case .migrationStarted(_, let from, let to, let steps, _) = event { return (from, to, steps) } else { return nil }
        }
        #expect(started.count == 1 && started[0] == (1, 5, 4))
    }

    @Test func failingMigrationRollsBackCompletelyAndSucceedsOnRetryAfterTheFix() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_items.sql", "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT);")
            .write("0002_fill.sql", "INSERT INTO items (name) VALUES ('a'), ('b');")
            .write("0003_broken.sql", "CREATE TABLE extra (x);\nINSERT INTO items (name) VALUES ('c');\nINSERT INTO missing_table VALUES (1);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("carol")) }
        guard case .migrationFailed(let failedUser, let version, let file, let message, let code, let schemaVersion) = error else {
            Issue.record("expected migrationFailed, got \(String(describing: error))"); return
        }
        #expect(failedUser == user("carol") && version == 3 && file == "0003_broken.sql" && schemaVersion == 2)
        #expect(message.contains("no such table: missing_table"))
        #expect(code == 1)
        // A second request gets the same answer without re-running the migration.
        await #expect(throws: StoreError.self) { try await harness.registry.info(user("carol")) }
        #expect(harness.recorder.count { if case .migrationFailed = $0 { true } else { false } } == 1)

        // Everything of migration 3 was rolled back; 1 and 2 are intact.
        let state = try await harness.registry.withStore(user("carol"), access: .admin) { store in
            try await store.read { db in
                (try Int.fetchOne(db, sql: "SELECT count(*) FROM items")!,
                 try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'extra')")!,
                 try BookkeepingSnapshot.read(db),
                 try Int.fetchOne(db, sql: "PRAGMA synchronous")!)
            }
        }
        #expect(state.0 == 2 && state.1 == false)
        #expect(state.3 == 2) // FULL again after a run that stopped half-way
        #expect(state.2.userVersion == 2 && state.2.migrations == [1, 2])

        // Another user is unaffected... by a store that cannot migrate (a different failure path).
        try folder.write("0003_broken.sql", "CREATE TABLE extra (x);\nINSERT INTO items (name) VALUES ('c');")
        let otherHarnessMigrations = try folder.load()
        harness.registry.reload(migrations: otherHarnessMigrations)
        #expect(try await harness.registry.info(user("carol")).schemaVersion == 3)
        #expect(try await harness.registry.info(user("dave")).schemaVersion == 3)
    }

    @Test func otherUsersAreServedWhileOneStoreFails() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_t.sql", "CREATE TABLE t (v TEXT);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        try await harness.registry.withStore(user("dup")) { store in
            try await store.write { db in try db.execute(sql: "INSERT INTO t VALUES ('same'), ('same')") }
        }
        try folder.write("0002_unique.sql", "CREATE UNIQUE INDEX t_unique ON t (v);")
        harness.registry.reload(migrations: try folder.load())
        await #expect(throws: StoreError.self) { try await harness.registry.info(user("dup")) }
        for index in 0..<10 { #expect(try await harness.registry.info(user("fine\(index)")).schemaVersion == 2) }
        // Repair the data as an administrator, then retry: no restart, no reload.
        try await harness.registry.withStore(user("dup"), access: .admin) { store in
            try await store.write { db in try db.execute(sql: "DELETE FROM t WHERE rowid = 2") }
        }
        #expect(try await harness.registry.migrate(user("dup")).applied == [2])
        #expect(try await harness.registry.info(user("dup")).schemaVersion == 2)
    }

    @Test func storeTooNewIsRefusedAndLeftByteIdentical() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_a.sql", "CREATE TABLE a (x);")
            .write("0002_b.sql", "CREATE TABLE b (x);")
            .write("0003_c.sql", "CREATE TABLE c (x);")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            _ = try await harness.registry.info(user("erin"))
            await harness.registry.shutdown()
        }
        let path = StoreLayout(dataDirectory: directory.path + "/data").storePath(for: user("erin"))
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        try folder.remove("0003_c.sql")
        let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "0.9")
        let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("erin")) }
        #expect(error == .storeTooNew(user: user("erin"), storeVersion: 3, knownVersion: 2))
        await #expect(throws: StoreError.self) { try await harness.registry.migrate(user("erin")) }
        await harness.registry.shutdown()
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        #expect(BackupKeeper(layout: harness.layout).list(user: user("erin")).isEmpty)
    }

    @Test func tableRebuildOfACascadeParentKeepsEveryChildRow() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_notes.sql", try String(contentsOfFile: exampleMigrationsDirectory + "/0001_notes.sql", encoding: .utf8))
            .write("0002_tags.sql", try String(contentsOfFile: exampleMigrationsDirectory + "/0002_tags.sql", encoding: .utf8))
            .write("0003_pinned.sql", try String(contentsOfFile: exampleMigrationsDirectory + "/0003_pinned.sql", encoding: .utf8))
        let harness = try Harness(directory: directory, migrations: try folder.load())
        try await harness.registry.withStore(user("frank")) { store in
            try await store.write { db in
                try db.execute(sql: "INSERT INTO tags (id, name) VALUES (1, 'work'), (2, 'home')")
                for note in 1...50 {
                    try db.execute(sql: "INSERT INTO notes (id, title) VALUES (?, ?)", arguments: [note, "note \(note)"])
                    try db.execute(sql: "INSERT INTO note_tags VALUES (?, 1), (?, 2)", arguments: [note, note])
                }
            }
        }
        // Migration 6 of the example rebuilds `notes`, the parent of ON DELETE CASCADE children.
        for file in ["0004_notes_by_date.sql", "0005_trim_titles.sql", "0006_title_limit.sql"] {
            try folder.write(file, try String(contentsOfFile: exampleMigrationsDirectory + "/" + file, encoding: .utf8))
        }
        harness.registry.reload(migrations: try folder.load())
        #expect(try await harness.registry.migrate(user("frank")).applied == [4, 5, 6])
        try await harness.registry.withStore(user("frank")) { store in
            try await store.read { (db: Database) throws in
                #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM note_tags") == 100)
                #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM notes") == 50)
                #expect(try String.fetchAll(db, sql: "PRAGMA integrity_check") == ["ok"])
                #expect(try Row.fetchAll(db, sql: "PRAGMA foreign_key_check").isEmpty)
                #expect(try String.fetchOne(db, sql: "SELECT sql FROM sqlite_master WHERE name = 'notes'")?.contains("CHECK") == true)
            }
        }
    }

    @Test func theSameRebuildWithForeignKeysOnWouldHaveLostTheChildren() throws {
        // The control for the test above: this is the data loss the engine prevents.
        let queue = try DatabaseQueue()
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA foreign_keys = ON")
            try db.execute(sql: """
                CREATE TABLE p (id INTEGER PRIMARY KEY);
                CREATE TABLE c (p INTEGER REFERENCES p(id) ON DELETE CASCADE);
                INSERT INTO p VALUES (1), (2); INSERT INTO c VALUES (1), (2);
                """)
            try db.inTransaction {
                try db.execute(sql: "PRAGMA foreign_keys = OFF") // a no-op inside a transaction
                try db.execute(sql: "CREATE TABLE p_new (id INTEGER PRIMARY KEY); INSERT INTO p_new SELECT id FROM p; DROP TABLE p; ALTER TABLE p_new RENAME TO p;")
                return .commit
            }
            #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM c") == 0)
        }
    }

    @Test func foreignKeyViolationsFailTheMigration() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_p.sql", "CREATE TABLE p (id INTEGER PRIMARY KEY);\nCREATE TABLE c (p INTEGER REFERENCES p(id));")
            .write("0002_orphan.sql", "INSERT INTO c VALUES (42);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("gina")) }
        guard case .migrationFailed(_, 2, _, let message, _, 1) = error else { Issue.record("\(String(describing: error))"); return }
        #expect(message.contains("foreign key check failed"))
    }

    @Test func appVersionGatingRunsDataFixesOnlyForOlderStores() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_t.sql", "CREATE TABLE t (title TEXT);\nINSERT INTO t VALUES ('  padded  ');")
        for (name, version) in [("old", "1.9"), ("new", "1.10")] {
            let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: version)
            _ = try await harness.registry.info(user(name))
            await harness.registry.shutdown()
        }
        try folder.write("0002_trim.sql", "-- userstore:app-version-below 1.10\nUPDATE t SET title = trim(title);")
        let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "2.0")
        for name in ["old", "new"] { _ = try await harness.registry.migrate(user(name)) }
        await harness.registry.shutdown()
        try harness.inspect("old") { (db: Database) throws in
            #expect(try String.fetchOne(db, sql: "SELECT title FROM t") == "padded")
            #expect(try Bool.fetchOne(db, sql: "SELECT skipped FROM schema_migrations WHERE version = 2") == false)
        }
        try harness.inspect("new") { (db: Database) throws in
            #expect(try String.fetchOne(db, sql: "SELECT title FROM t") == "  padded  ")
            #expect(try Bool.fetchOne(db, sql: "SELECT skipped FROM schema_migrations WHERE version = 2") == true)
            #expect(try Int64.fetchOne(db, sql: "PRAGMA user_version") == 2)
        }
    }

    @Test func outOfOrderFilesAreRefusedUnlessAllowed() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_a.sql", "CREATE TABLE a (x);")
            .write("0003_c.sql", "CREATE TABLE c (x);")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            _ = try await harness.registry.info(user("hank"))
            await harness.registry.shutdown()
        }
        try folder.write("0002_b.sql", "CREATE TABLE b (x);")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("hank")) }
            #expect(error == .outOfOrderMigration(user: user("hank"), version: 2, migration: "0002_b.sql", latestApplied: 3))
            await harness.registry.shutdown()
        }
        let harness = try Harness(directory: directory, migrations: try folder.load(), policy: MigrationPolicy(allowOutOfOrder: true))
        let report = try await harness.registry.migrate(user("hank"))
        #expect(report.applied == [2] && report.toVersion == 3)
        await harness.registry.shutdown()
        try harness.inspect("hank") { (db: Database) throws in
            #expect(try BookkeepingSnapshot.read(db).migrations == [1, 2, 3])
            #expect(try Int64.fetchOne(db, sql: "PRAGMA user_version") == 3)
        }
    }

    @Test func aChangedAppliedFileIsReportedAndCanBeAccepted() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_a.sql", "CREATE TABLE a (x);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        _ = try await harness.registry.info(user("ivan"))
        // CRLF endings alone are not a change.
        try folder.write("0001_a.sql", "CREATE TABLE a (x);\r\n")
        harness.registry.reload(migrations: try folder.load())
        #expect(try await harness.registry.info(user("ivan")).schemaVersion == 1)
        try folder.write("0001_a.sql", "CREATE TABLE a (x, y);")
        try folder.write("0002_b.sql", "CREATE TABLE b (x);")
        harness.registry.reload(migrations: try folder.load())
        let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("ivan")) }
        guard case .checksumMismatch(_, 1, "0001_a.sql", _, _) = error else { Issue.record("\(String(describing: error))"); return }
        #expect(try await harness.registry.verify(user("ivan")).problems.contains { $0.contains("changed after it was applied") })
        #expect(try await harness.registry.acceptChecksums(user("ivan")) == [1])
        #expect(try await harness.registry.info(user("ivan")).schemaVersion == 2)
        #expect(try await harness.registry.verify(user("ivan")).ok)
    }

    @Test func rollbackRunsDownSectionsInReverseEvenWhenTheFileIsGone() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_a.sql", "-- Up\nCREATE TABLE a (x);\n-- Down\nDROP TABLE a;")
            .write("0002_b.sql", "-- Up\nCREATE TABLE b (x);\n-- Down\nDROP TABLE b;")
            .write("0003_c.sql", "-- Up\nCREATE TABLE c (x);\n-- Down\nDROP TABLE c;")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        _ = try await harness.registry.info(user("judy"))
        try folder.remove("0003_c.sql")
        try folder.remove("0002_b.sql")
        harness.registry.reload(migrations: try folder.load())
        #expect(try await harness.registry.rollback(user("judy"), to: 1) == ([3, 2], 1))
        let tables = try await harness.registry.withStore(user("judy"), access: .admin) { store in
            try await store.read { db in
                (try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('a','b','c') ORDER BY name"),
                 try BookkeepingSnapshot.read(db))
            }
        }
        #expect(tables.0 == ["a"])
        #expect(tables.1.userVersion == 1 && tables.1.schemaVersion == 1 && tables.1.migrations == [1])
        #expect(try await harness.registry.verify(user("judy")).ok)

        try folder.write("0002_b.sql", "CREATE TABLE b (x);")
        harness.registry.reload(migrations: try folder.load())
        _ = try await harness.registry.migrate(user("judy"))
        let error = await #expect(throws: StoreError.self) { try await harness.registry.rollback(user("judy"), to: 0) }
        #expect(error == .irreversibleMigration(user: user("judy"), version: 2, migration: "0002_b.sql"))
    }

    @Test func backupIsTakenBeforeMigratingDataAndPrunedByRetention() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_a.sql", "CREATE TABLE a (x);\nINSERT INTO a VALUES ('kept');")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            _ = try await harness.registry.info(user("kim"))
            #expect(BackupKeeper(layout: harness.layout).list(user: user("kim")).isEmpty) // a new store has nothing to back up
            await harness.registry.shutdown()
        }
        try folder.write("0002_b.sql", "DELETE FROM a;")
        let backup: String
        do {
            let keep = try Harness(directory: directory, migrations: try folder.load())
            let report = try await keep.registry.migrate(user("kim"))
            backup = try #require(report.backupPath)
            await keep.registry.shutdown()
        }
        let copy = try DatabaseQueue(path: backup)
        let copied = try await copy.read { (db: Database) throws -> ([String], Int64?) in (try String.fetchAll(db, sql: "SELECT x FROM a"), try Int64.fetchOne(db, sql: "PRAGMA user_version")) }
        #expect(copied.0 == ["kept"] && copied.1 == 1)
        try copy.close()
        #expect(BackupKeeper.isBackup(URL(fileURLWithPath: backup).lastPathComponent, of: user("kim")))
        #expect(!BackupKeeper.isBackup(URL(fileURLWithPath: backup).lastPathComponent, of: user("ki")))

        // A copy a crash left half-written is never listed, and the next prune removes it.
        let leftover = backup.replacingOccurrences(of: ".v1.", with: ".v7.") + BackupKeeper.partialSuffix
        #expect(FileManager.default.createFile(atPath: leftover, contents: Data("half".utf8)))
        #expect(!BackupKeeper(layout: StoreLayout(dataDirectory: directory.path + "/data")).list(user: user("kim")).contains(leftover))

        try folder.write("0003_c.sql", "CREATE TABLE c (x);")
        let prune = try Harness(directory: directory, migrations: try folder.load(),
                                policy: MigrationPolicy(backupRetentionSeconds: 0))
        _ = try await prune.registry.migrate(user("kim"))
        #expect(BackupKeeper(layout: prune.layout).list(user: user("kim")).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: leftover))
    }

    @Test func planShowsWhatWouldRunWithoutWriting() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_a.sql", "CREATE TABLE a (x);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let fresh = try await harness.registry.plan(user("lee"))
        #expect(fresh.isNewStore && fresh.steps.map(\.version) == [1])
        #expect(!FileManager.default.fileExists(atPath: harness.layout.storePath(for: user("lee"))))
        _ = try await harness.registry.info(user("lee"))
        try folder.write("0002_b.sql", "CREATE TABLE b (x);")
        harness.registry.reload(migrations: try folder.load())
        let plan = try await harness.registry.plan(user("lee"))
        #expect(!plan.isNewStore && plan.fromVersion == 1 && plan.toVersion == 2 && plan.steps.map(\.version) == [2])
        let version = try await harness.registry.withStore(user("lee"), access: .admin) { store in
            try await store.read { try Int64.fetchOne($0, sql: "PRAGMA user_version") }
        }
        #expect(version == 2) // the lease itself migrated it; the plan before did not
    }

    @Test func damagedFileIsRefusedAndOthersAreServed() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_a.sql", "CREATE TABLE a (x);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let path = harness.layout.storePath(for: user("mallory"))
        try FileManager.default.createDirectory(atPath: harness.layout.storeDirectory(for: user("mallory")), withIntermediateDirectories: true)
        try Data(repeating: 0x42, count: 8192).write(to: URL(fileURLWithPath: path))
        let error = await #expect(throws: StoreError.self) { try await harness.registry.info(user("mallory")) }
        guard case .storeDamaged(let damaged, _) = error else { Issue.record("\(String(describing: error))"); return }
        #expect(damaged == user("mallory"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(repeating: 0x42, count: 8192))
        #expect(try await harness.registry.info(user("nick")).schemaVersion == 1)
    }
}
