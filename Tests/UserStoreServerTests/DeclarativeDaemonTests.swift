import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// A desired schema (`schemaFile`) through the real daemon and CLI: numbered migrations first,
/// then the reconcile; `plan` prints the SQL before it runs; `migrate --all` reconciles the fleet.
@Suite(.serialized) struct DeclarativeDaemonTests {
    @Test func aDesiredSchemaIsPlannedShownAndAppliedAcrossTheFleet() throws {
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT);"],
                                       extraConfig: "schemaFile: schema.sql")
        let schemaPath = daemon.directory.path + "/schema.sql"
        try "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT);\n".write(toFile: schemaPath, atomically: true, encoding: .utf8)
        try daemon.start()
        let client = try daemon.connect()
        for user in ["a", "b", "c"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title) VALUES ('12')"])
        }
        // The desired schema changes: a typed column, a new table, an index.
        try """
            CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL CHECK (length(title) <= 200), pinned INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
            CREATE INDEX notes_by_pinned ON notes (pinned);
            """.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        _ = try client.call("io.userstore.Admin.Reload")
        // Only the reconcile is pending: a dry run must still call the stores planned.
        let dryRun = try client.call("io.userstore.Admin.Migrate", ["all": true, "dryRun": true])
        #expect(dryRun["done"] == 3 && dryRun["failures"] == 0)
        let states = try run([productsDirectory + "/userstorectl", "migrate", "--all", "--dry-run", "--json", "--socket", daemon.socketPath])
        #expect(states.stdout.components(separatedBy: "\"state\":\"planned\"").count - 1 == 3, "\(states.stdout)")

        let plan = try run([productsDirectory + "/userstorectl", "plan", "a", "--socket", daemon.socketPath])
        #expect(plan.status == 0, "\(plan.stderr)")
        #expect(plan.stdout.contains("-- reconcile with schema.sql"))
        #expect(plan.stdout.contains("CREATE TABLE \"_userstore_new_notes\""))
        #expect(plan.stdout.contains("CREATE INDEX notes_by_pinned ON notes (pinned);"))
        let planned = try client.call("io.userstore.Admin.Plan", ["user": "a"])["reconcile"]?.arrayValue?.compactMap(\.stringValue) ?? []

        let migrate = try run([productsDirectory + "/userstorectl", "migrate", "--all", "--socket", daemon.socketPath])
        #expect(migrate.status == 0, "\(migrate.stdout)\(migrate.stderr)")
        #expect(migrate.stdout.contains("3 migrated"))
        for user in ["a", "b", "c"] {
            let rows = try client.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT title, pinned FROM notes"])
            #expect(rows["rows"] == [["12", 0]])
            #expect(try client.call("io.userstore.Admin.Plan", ["user": .string(user)])["reconcile"] == [])
        }
        // A new store gets the numbered migrations, then the reconcile.
        #expect(try client.call("io.userstore.Store.Execute", ["user": "d", "sql": "INSERT INTO tags (name) VALUES ('x')"])["changes"] == 1)
        #expect(planned.count >= 5)
        daemon.stop()
        #expect(daemon.stderr.contains("applied migration schema.sql"))
    }

    @Test func anInvalidSchemaFileRefusesToStartNamingIt() throws {
        let daemon = try DaemonHarness(migrations: ["0001_a.sql": "CREATE TABLE a (x);"], extraConfig: "schemaFile: schema.sql")
        try "CREATE TABLE a (x INTEGER,);".write(toFile: daemon.directory.path + "/schema.sql", atomically: true, encoding: .utf8)
        try daemon.start(waitForReady: false)
        #expect(daemon.waitForExit() == 78)
        #expect(daemon.stderr.contains("schema.sql"))
    }
}
