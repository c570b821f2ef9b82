import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// Declarative schema: a store with data, reconciled to a desired schema through the registry
/// (so foreign keys, transactions and events are the migration engine's), then checked.
@Suite struct DeclarativeSchemaTests {
    struct Outcome {
        let harness: Harness
        let report: MigrationReport?
        let error: StoreError?
        let user: UserID

        /// Runs `body` on the store (admin access: works whatever state it is in).
        func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
            try await harness.registry.withStore(user, access: .admin) { try await $0.read(body) }
        }
    }

    /// Creates a store from `initial` (as migration 1), fills it with `data`, then reconciles
    /// it with `desired`; checks integrity, foreign keys and that a second plan is empty.
    func reconcile(_ initial: String, data: String = "", to desired: String, allowDestructive: Bool = false,
                   sourceLocation: SourceLocation = #_sourceLocation) async throws -> Outcome {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_initial.sql", initial)
        let harness = try Harness(directory: directory, migrations: try folder.load(),
                                  policy: MigrationPolicy(allowDestructiveSchemaChanges: allowDestructive))
        let user = user("dora")
        if !data.isEmpty {
            try await harness.registry.withStore(user) { store in try await store.write { try $0.execute(sql: data) } }
        }
        let schema = try DesiredSchema(fileName: "schema.sql", sql: desired)
        harness.registry.reload(migrations: try folder.load().with(schema: schema))
        var report: MigrationReport?
        var failure: StoreError?
        do { report = try await harness.registry.migrate(user) } catch { failure = error as? StoreError }
        let outcome = Outcome(harness: harness, report: report, error: failure, user: user)
        let checks = try await outcome.read { db in
            (try String.fetchAll(db, sql: "PRAGMA integrity_check"), try Row.fetchAll(db, sql: "PRAGMA foreign_key_check").count,
             try schema.plan(db).statements)
        }
        #expect(checks.0 == ["ok"], sourceLocation: sourceLocation)
        #expect(checks.1 == 0, sourceLocation: sourceLocation)
        if failure == nil { #expect(checks.2 == [], "a second reconcile must plan nothing", sourceLocation: sourceLocation) }
        return outcome
    }

    @Test func addTableAndColumnsInPlace() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT);", data: "INSERT INTO a (x) VALUES ('one'), ('two');",
            to: """
                CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT, y TEXT, z INTEGER NOT NULL DEFAULT 7);
                CREATE TABLE b (id INTEGER PRIMARY KEY, a_id INTEGER REFERENCES a (id));
                """)
        #expect(outcome.error == nil)
        #expect(outcome.report?.reconciled == [
            "CREATE TABLE b (id INTEGER PRIMARY KEY, a_id INTEGER REFERENCES a (id));",
            "ALTER TABLE \"a\" ADD COLUMN y TEXT;",
            "ALTER TABLE \"a\" ADD COLUMN z INTEGER NOT NULL DEFAULT 7;",
        ])
        let rows = try await outcome.read { try Row.fetchAll($0, sql: "SELECT x, y, z FROM a ORDER BY id").map { [$0[0] as String?, $0[1] as String?, ($0[2] as Int?).map(String.init)] } }
        #expect(rows == [["one", nil, "7"], ["two", nil, "7"]])
    }

    @Test func addAndDropIndexes() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT, y TEXT);\nCREATE INDEX a_by_x ON a (x);", data: "INSERT INTO a (x, y) VALUES ('1', '2');",
            to: "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT, y TEXT);\nCREATE INDEX a_by_y ON a (y);")
        #expect(outcome.report?.reconciled == ["DROP INDEX \"a_by_x\";", "CREATE INDEX a_by_y ON a (y);"])
    }

    @Test func droppingAColumnWithDataIsRefusedUnlessAllowed() async throws {
        let initial = "CREATE TABLE a (id INTEGER PRIMARY KEY, keep TEXT, gone TEXT);"
        let data = "INSERT INTO a (keep, gone) VALUES ('k1', 'g1'), ('k2', 'g2');"
        let desired = "CREATE TABLE a (id INTEGER PRIMARY KEY, keep TEXT);"
        let refused = try await reconcile(initial, data: data, to: desired)
        guard case .migrationFailed(_, _, "schema.sql", let message, _, _)? = refused.error else {
            Issue.record("expected a refusal, got \(String(describing: refused.error))"); return
        }
        #expect(message.contains("drops column a.gone, which holds data in 2 rows"))
        #expect(try await refused.read { try Int.fetchOne($0, sql: "SELECT count(gone) FROM a") } == 2)

        let allowed = try await reconcile(initial, data: data, to: desired, allowDestructive: true)
        #expect(allowed.error == nil)
        let rows = try await allowed.read { try Row.fetchAll($0, sql: "SELECT id, keep FROM a ORDER BY id").map { "\($0[0] as Int):\($0[1] as String)" } }
        #expect(rows == ["1:k1", "2:k2"])
        #expect(try await allowed.read { try Row.fetchAll($0, sql: "PRAGMA table_info(a)").count } == 2)
    }

    @Test func changingAColumnTypeConvertsValuesByTheNewAffinity() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE a (id INTEGER PRIMARY KEY, n TEXT);", data: "INSERT INTO a (n) VALUES ('12'), ('x');",
            to: "CREATE TABLE a (id INTEGER PRIMARY KEY, n INTEGER);")
        #expect(outcome.error == nil)
        let values = try await outcome.read { try String.fetchAll($0, sql: "SELECT typeof(n) || ':' || n FROM a ORDER BY id") }
        #expect(values == ["integer:12", "text:x"])
    }

    @Test func changingACheckAndAddingAForeignKeyRebuild() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT CHECK (length(name) < 5));\nCREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER);",
            data: "INSERT INTO parent VALUES (1, 'abc');\nINSERT INTO child VALUES (1, 1);",
            to: "CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT CHECK (length(name) < 50));\nCREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id));")
        #expect(outcome.error == nil)
        #expect(outcome.report?.reconciled.contains { $0.hasPrefix("CREATE TABLE \"_userstore_new_parent\"") } == true)
        #expect(outcome.report?.reconciled.contains { $0.hasPrefix("CREATE TABLE \"_userstore_new_child\"") } == true)
        let long = try await outcome.read { db in try Row.fetchAll(db, sql: "PRAGMA foreign_key_list(child)").count }
        #expect(long == 1)
    }

    @Test func aRebuiltCascadeParentKeepsEveryChildRow() async throws {
        let initial = """
            CREATE TABLE parent (id INTEGER PRIMARY KEY, title TEXT);
            CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE);
            """
        let data = (1...20).map { "INSERT INTO parent VALUES (\($0), 'p\($0)'); INSERT INTO child (parent_id) VALUES (\($0)), (\($0));" }.joined(separator: "\n")
        let outcome = try await reconcile(initial, data: data, to: """
            CREATE TABLE parent (id INTEGER PRIMARY KEY, title TEXT NOT NULL DEFAULT '' CHECK (length(title) <= 200));
            CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE);
            """)
        #expect(outcome.error == nil)
        #expect(try await outcome.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM child") } == 40)
        #expect(try await outcome.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM parent") } == 20)
    }

    @Test func triggersAndViewsSurviveARebuild() async throws {
        let schema = { (type: String) in """
            CREATE TABLE item (id INTEGER PRIMARY KEY, price \(type));
            CREATE TABLE log (item_id INTEGER);
            CREATE TRIGGER item_logged AFTER INSERT ON item BEGIN INSERT INTO log VALUES (new.id); END;
            CREATE VIEW expensive AS SELECT id FROM item WHERE price > 10;
            """ }
        let outcome = try await reconcile(schema("TEXT"), data: "INSERT INTO item (price) VALUES ('5'), ('50');", to: schema("REAL"))
        #expect(outcome.error == nil)
        try await outcome.harness.registry.withStore(outcome.user) { store in
            try await store.write { try $0.execute(sql: "INSERT INTO item (price) VALUES (99)") }
        }
        let state = try await outcome.read { db in
            (try Int.fetchAll(db, sql: "SELECT item_id FROM log ORDER BY item_id"), try Int.fetchAll(db, sql: "SELECT id FROM expensive ORDER BY id"),
             try String.fetchOne(db, sql: "SELECT typeof(price) FROM item WHERE id = 1"))
        }
        #expect(state.0 == [1, 2, 3]) // the trigger still fires
        #expect(state.1 == [2, 3])    // the view still works, over converted values
        #expect(state.2 == "real")
    }

    @Test func anAutoincrementCounterIsKept() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT);",
            data: "INSERT INTO t (v) VALUES ('a'), ('b'), ('c'), ('d'), ('e'); DELETE FROM t WHERE id > 3;",
            to: "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT NOT NULL DEFAULT '');")
        #expect(outcome.error == nil)
        try await outcome.harness.registry.withStore(outcome.user) { store in
            try await store.write { try $0.execute(sql: "INSERT INTO t (v) VALUES ('next')") }
        }
        #expect(try await outcome.read { try Int.fetchOne($0, sql: "SELECT id FROM t WHERE v = 'next'") } == 6)
    }

    @Test func declaredRenamesKeepTheData() async throws {
        let outcome = try await reconcile(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, name TEXT);\nCREATE INDEX notes_by_name ON notes (name);",
            data: "INSERT INTO notes (name) VALUES ('kept');",
            to: """
                CREATE TABLE memos ( -- renamed from: notes
                    id INTEGER PRIMARY KEY,
                    title TEXT -- renamed from: name
                );
                CREATE INDEX notes_by_name ON memos (title);
                """)
        #expect(outcome.error == nil)
        #expect(outcome.report?.reconciled == ["ALTER TABLE \"notes\" RENAME TO \"memos\";", "ALTER TABLE \"memos\" RENAME COLUMN \"name\" TO \"title\";"])
        #expect(try await outcome.read { try String.fetchOne($0, sql: "SELECT title FROM memos") } == "kept")
    }

    @Test func thePlanIsWhatIsThenApplied() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_a.sql", "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        _ = try await harness.registry.migrate(user("pia"))
        let schema = try DesiredSchema(fileName: "schema.sql", sql: "CREATE TABLE a (id INTEGER PRIMARY KEY, x INTEGER, y TEXT);\nCREATE INDEX a_y ON a (y);")
        harness.registry.reload(migrations: try folder.load().with(schema: schema))
        let plan = try await harness.registry.plan(user("pia"))
        #expect(plan.reconcile && !plan.reconcileStatements.isEmpty)
        let again = try await harness.registry.plan(user("pia"))
        #expect(again.reconcileStatements == plan.reconcileStatements) // deterministic
        let report = try await harness.registry.migrate(user("pia"))
        #expect(report.reconciled == plan.reconcileStatements)
        // Recorded by hash: the next open costs nothing, and a plan is empty.
        #expect(try await harness.registry.plan(user("pia")).isEmpty)
        let steps = harness.recorder.events.compactMap { event -> String? in
            if case .migrationStep(_, _, let migration, _, _, _, _) = event { return migration } else { return nil }
        }
        #expect(steps.last == "schema.sql")
    }

    @Test func aSchemaFileWithOtherStatementsIsRefused() {
        #expect(throws: DesiredSchema.LoadError.self) { try DesiredSchema(fileName: "schema.sql", sql: "CREATE TABLE a (x);\nINSERT INTO a VALUES (1);") }
        #expect(throws: DesiredSchema.LoadError.self) { try DesiredSchema(fileName: "schema.sql", sql: "CREATE TABLE a (x INTEGER,);") }
    }
}
