import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// A store's whole life through the socket and userstorectl: delete, export, import, backups,
/// restore — and the named errors for bad input.
@Suite(.serialized) struct LifecycleTests {
    func ctl(_ daemon: DaemonHarness, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        try run([userstorectlPath] + arguments, environment: ["USERSTORE_SOCKET": daemon.socketPath])
    }

    func sqlite3(_ path: String, _ sql: String) throws -> String {
        let result = try run(["/usr/bin/sqlite3", path, sql])
        #expect(result.status == 0, "\(result.stderr)")
        return result.stdout
    }

    /// Every file under the data directory whose name mentions `user`.
    func files(of user: String, in daemon: DaemonHarness) -> [String] {
        (FileManager.default.enumerator(atPath: daemon.dataDirectory)?.compactMap { $0 as? String } ?? [])
            .filter { ($0 as NSString).lastPathComponent.contains(user) }
    }

    @Test func deleteLeavesNoFileOfTheUserBehind() throws {
        let daemon = try DaemonHarness(extraConfig: "migrations:\n  backupRetentionSeconds: 86400\n")
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title) VALUES ('private')"])
        _ = try client.call("io.userstore.Admin.Backup", ["user": "alice"])
        _ = try client.call("io.userstore.Store.Execute", ["user": "alicia", "sql": "INSERT INTO notes (title) VALUES ('neighbour')"])
        // A new migration that rewrites rows: the next request copies alice's store before migrating it.
        try daemon.addMigration("0007_x.sql", "ALTER TABLE notes ADD COLUMN x INTEGER;\nUPDATE notes SET x = 0;")
        _ = try client.call("io.userstore.Admin.Reload")
        _ = try client.call("io.userstore.Store.Open", ["user": "alice"])
        let before = files(of: "alice", in: daemon).filter { !$0.contains("alicia") }
        #expect(before.count == 4, "\(before)") // the store, its WAL and two backups

        let result = try ctl(daemon, ["delete", "alice", "--yes", "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        let reply = try JSONParser().parse(result.stdout)
        #expect(reply["existed"] == true && reply["removedFiles"]?.arrayValue?.count == 3) // closing the store checkpointed its WAL away
        #expect(files(of: "alice", in: daemon).filter { !$0.contains("alicia") }.isEmpty)
        var listed: [JSONValue] = []
        try client.stream("io.userstore.Admin.ListStores") { reply in if let store = reply["store"] { listed.append(store) } }
        #expect(!listed.contains { $0["user"] == "alice" } && listed.contains { $0["user"] == "alicia" })
        // Another user is untouched; alice starts again empty.
        #expect(try client.call("io.userstore.Store.Query", ["user": "alicia", "sql": "SELECT title FROM notes"])["rows"] == [["neighbour"]])
        let reopened = try client.call("io.userstore.Store.Open", ["user": "alice"])
        #expect(reopened["created"] == true)
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"])["rows"] == [[0]])
        // Deleting a user without a store says so.
        let nothing = try client.call("io.userstore.Admin.DeleteStore", ["user": "nobody"])
        #expect(nothing["existed"] == false && nothing["removedFiles"] == [])
        // Without --yes and off a terminal, nothing is deleted.
        let refused = try ctl(daemon, ["delete", "alicia"])
        #expect(refused.status == 2 && refused.stderr.contains("--yes"))
        #expect(!files(of: "alicia", in: daemon).isEmpty)
        daemon.stop()
        #expect(daemon.stderr.contains("store deleted"))
    }

    static let values: [JSONValue] = [
        .null, .integer(Int64.max), .integer(Int64.min), .real(2.0), .real(-1e-300), .string("nul\u{0}inside"),
        .string("emoji 🎉"), .object(["blob": .string(Data([0, 1, 254, 255]).base64EncodedString())]),
    ]

    @Test func exportedStoresOpenWithSqlite3AndJSONRoundTripsEveryValue() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "bob", "sql": "CREATE TABLE v (k INTEGER PRIMARY KEY, value)"])
        for (key, value) in Self.values.enumerated() {
            _ = try client.call("io.userstore.Store.Execute", ["user": "bob", "sql": "INSERT INTO v VALUES (?, ?)", "parameters": [.integer(Int64(key)), value]])
        }
        _ = try client.call("io.userstore.Store.Execute", ["user": "bob", "sql": "INSERT INTO notes (title) VALUES ('a'), ('b')"])

        // sqlite format through the CLI: the stock shell reads the same rows.
        let file = daemon.directory.path + "/bob.sqlite"
        let exported = try ctl(daemon, ["export", "bob", "-o", file])
        #expect(exported.status == 0, "\(exported.stderr)")
        #expect(try sqlite3(file, "SELECT title FROM notes ORDER BY id") == "a\nb\n")
        #expect(try sqlite3(file, "SELECT count(*), typeof(value) FROM v WHERE k = 1") == "1|integer\n")
        #expect(try sqlite3(file, "PRAGMA integrity_check") == "ok\n")
        #expect(try sqlite3(file, "SELECT schema_version FROM app_version") == "6\n")

        // json format through the socket: every value as Query returns it.
        var tables: [String: [JSONValue]] = [:]
        try client.stream("io.userstore.Admin.ExportStore", ["user": "bob", "format": "json"]) { reply in
            guard let table = reply["table"]?.stringValue else { return }
            tables[table, default: []] += reply["rows"]?.arrayValue ?? []
        }
        let queried = try client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT * FROM v"])["rows"]?.arrayValue ?? []
        #expect(tables["v"] == queried)
        #expect(tables["v"]?.compactMap { $0.arrayValue?.last } == Self.values)
        #expect(tables["notes"]?.count == 2)
        #expect(tables["app_version"]?.count == 1 && tables["schema_migrations"]?.count == 6)

        // Through the CLI: one JSON object per line.
        let lines = try ctl(daemon, ["export", "bob", "--format", "json"])
        #expect(lines.status == 0)
        #expect(lines.stdout.split(separator: "\n").compactMap { try? JSONParser().parse(String($0))["table"] }.contains("v"))

        // A user without a store: a named error, nothing created.
        #expect { try client.stream("io.userstore.Admin.ExportStore", ["user": "ghost"]) { _ in } } throws: {
            ($0 as? VarlinkError)?.name == "io.userstore.Admin.NoSuchStore"
        }
        #expect(files(of: "ghost", in: daemon).isEmpty)
        daemon.stop()
    }

    /// An FMDB-era file: the schema of migrations 1 and 2, its own rows, user_version 2.
    func fmdbFile(at path: String) throws {
        _ = try sqlite3(path, """
            CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL DEFAULT '',
                                created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
            CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE COLLATE NOCASE);
            CREATE TABLE note_tags (note_id INTEGER NOT NULL REFERENCES notes(id) ON DELETE CASCADE,
                                    tag_id INTEGER NOT NULL REFERENCES tags(id) ON DELETE CASCADE,
                                    PRIMARY KEY (note_id, tag_id)) WITHOUT ROWID;
            INSERT INTO notes (title, body) VALUES ('  old title  ', 'from the app'), ('second', '');
            INSERT INTO tags (name) VALUES ('work');
            INSERT INTO note_tags VALUES (1, 1);
            PRAGMA user_version = 2;
            """)
    }

    @Test func anFMDBFileIsImportedAndMigratedLazilyWithItsRows() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let source = daemon.directory.path + "/carol.db"
        try fmdbFile(at: source)
        let checksum = try Data(contentsOf: URL(fileURLWithPath: source))
        // Through the CLI, which passes the file as a descriptor.
        let result = try ctl(daemon, ["import", "carol", source, "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try JSONParser().parse(result.stdout)["schemaVersion"] == 2)
        #expect(try Data(contentsOf: URL(fileURLWithPath: source)) == checksum) // the source is untouched

        let client = try daemon.connect()
        let opened = try client.call("io.userstore.Store.Open", ["user": "carol"])
        #expect(opened["schemaVersion"] == 6 && opened["appliedVersions"] == [3, 4, 5, 6])
        #expect(opened["createdByAppVersion"] == "imported")
        // Migration 5 trims titles of stores last touched by apps older than 1.3: an import's
        // app version is this daemon's, so its data stay as they were.
        let notes = try client.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT body, pinned FROM notes ORDER BY id"])
        #expect(notes["rows"] == [["from the app", 0], ["", 0]])
        #expect(try client.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT count(*) FROM note_tags"])["rows"] == [[1]])
        let applied = try client.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT version, app_version FROM schema_migrations ORDER BY version"])
        #expect(applied["rows"]?.arrayValue?.prefix(2).map { $0.arrayValue?.last } == ["imported", "imported"])
        #expect(try client.call("io.userstore.Admin.Verify", ["users": ["carol"]])["failures"] == 0)

        // An independent client (Python) passes the descriptor itself, and asks to replace.
        let other = daemon.directory.path + "/dave.db"
        try fmdbFile(at: other)
        let script = """
            import json, os, socket, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            fd = os.open(sys.argv[2], os.O_RDONLY)
            call = {"method": "io.userstore.Admin.ImportStore", "parameters": {"user": "carol", "replace": True, "schemaVersion": 2}}
            socket.send_fds(s, [json.dumps(call).encode() + b"\\0"], [fd])
            data = b""
            while not data.endswith(b"\\0"): data += s.recv(65536)
            print(json.dumps(json.loads(data[:-1])))
            """
        let python = try run(["/usr/bin/python3", "-c", script, daemon.socketPath, other])
        let reply = try JSONParser().parse(python.stdout)
        #expect(reply["parameters"]?["replaced"] == true, "\(python.stdout)\(python.stderr)")
        let backups = try client.call("io.userstore.Admin.ListBackups", ["user": "carol"])["backups"]?.arrayValue ?? []
        // The lazy migration from version 2 copied the imported store first; the import that
        // replaced it copied the migrated one.
        #expect(backups.map { $0["reason"] } == ["before-migration", "before-import"])
        #expect(backups.map { $0["schemaVersion"] } == [2, 6])
        #expect(try client.call("io.userstore.Store.Open", ["user": "carol"])["appliedVersions"] == [3, 4, 5, 6])

        // Bulk: every matching file of a folder.
        let folder = daemon.directory.path + "/legacy"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for name in ["erin", "frank"] { try fmdbFile(at: folder + "/\(name).db") }
        try Data("not a database at all, just text that is long enough to look like something".utf8).write(to: URL(fileURLWithPath: folder + "/broken.db"))
        let bulk = try ctl(daemon, ["import", "--dir", folder, "--pattern", "{user}.db", "--json"])
        #expect(bulk.status == 1)
        let outcomes = bulk.stdout.split(separator: "\n").compactMap { try? JSONParser().parse(String($0)) }
        #expect(outcomes.filter { $0["state"] == "imported" }.compactMap { $0["user"]?.stringValue }.sorted() == ["erin", "frank"])
        #expect(outcomes.first { $0["user"] == "broken" }?["error"]?.stringValue?.contains("ImportRefused") == true)
        #expect(outcomes.last?["summary"] == true && outcomes.last?["failures"] == 1)
        daemon.stop()
        #expect(daemon.stderr.contains("store imported at schema version 2"))
    }

    @Test func restoreBringsBackTheRowsOfABackup() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "gina", "sql": "INSERT INTO notes (title) VALUES ('kept')"])
        let backup = try client.call("io.userstore.Admin.Backup", ["user": "gina"])["path"]?.stringValue ?? ""
        _ = try client.call("io.userstore.Store.Execute", ["user": "gina", "sql": "DELETE FROM notes"])
        _ = try client.call("io.userstore.Store.Execute", ["user": "gina", "sql": "INSERT INTO notes (title) VALUES ('later')"])

        let listed = try ctl(daemon, ["backups", "gina", "--json"])
        let entries = listed.stdout.split(separator: "\n").compactMap { try? JSONParser().parse(String($0)) }
        #expect(entries.count == 1 && entries.first?["reason"] == "manual" && entries.first?["path"] == .string(backup))
        #expect(entries.first?["bytes"]?.integerValue ?? 0 > 0 && entries.first?["schemaVersion"] == 6)

        let restored = try ctl(daemon, ["restore", "gina", (backup as NSString).lastPathComponent, "--json"])
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(try client.call("io.userstore.Store.Query", ["user": "gina", "sql": "SELECT title FROM notes"])["rows"] == [["kept"]])
        // The store it replaced was copied first.
        let after = try client.call("io.userstore.Admin.ListBackups", ["user": "gina"])["backups"]?.arrayValue ?? []
        #expect(after.map { $0["reason"] } == ["manual", "before-restore"])
        _ = try client.call("io.userstore.Admin.RestoreStore", ["user": "gina", "backup": after[1]["path"]!])
        #expect(try client.call("io.userstore.Store.Query", ["user": "gina", "sql": "SELECT title FROM notes"])["rows"] == [["later"]])
        daemon.stop()
    }

    @Test func badInputGetsNamedErrorsAndChangesNothing() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "hank", "sql": "INSERT INTO notes (title) VALUES ('mine')"])
        func error(_ method: String, _ parameters: [String: JSONValue]) -> VarlinkError? {
            do { _ = try client.call(method, parameters); return nil } catch { return error as? VarlinkError }
        }
        #expect(error("io.userstore.Admin.RestoreStore", ["user": "hank", "backup": "nope.sqlite"])?.name == "io.userstore.Admin.NoSuchBackup")
        #expect(error("io.userstore.Admin.DeleteStore", ["user": "../etc"])?.name == "io.userstore.Store.InvalidUser")
        #expect(error("io.userstore.Admin.ExportStore", ["user": "hank", "format": "xml"])?.name == "org.varlink.service.ExpectedMore")

        let text = daemon.directory.path + "/text.db"
        try Data(repeating: 0x41, count: 8192).write(to: URL(fileURLWithPath: text))
        let notSQLite = error("io.userstore.Admin.ImportStore", ["user": "ivy", "path": .string(text), "schemaVersion": 1])
        #expect(notSQLite?.name == "io.userstore.Admin.ImportRefused", "\(String(describing: notSQLite))")

        // A damaged database: random bytes over its second page.
        let damaged = daemon.directory.path + "/damaged.db"
        try fmdbFile(at: damaged)
        _ = try sqlite3(damaged, "CREATE TABLE filler (x); INSERT INTO filler SELECT randomblob(1000) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 50) SELECT i FROM n);")
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: damaged))
        try handle.seek(toOffset: 4096)
        try handle.write(contentsOf: Data((0..<4096).map { _ in UInt8.random(in: 0...255) }))
        try handle.close()
        #expect(error("io.userstore.Admin.ImportStore", ["user": "ivy", "path": .string(damaged), "schemaVersion": 2])?.name == "io.userstore.Admin.ImportRefused")

        // No version to go by.
        let bare = daemon.directory.path + "/bare.db"
        _ = try sqlite3(bare, "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
        let unversioned = error("io.userstore.Admin.ImportStore", ["user": "ivy", "path": .string(bare)])
        #expect(unversioned?.name == "io.userstore.Admin.ImportRefused")
        #expect(unversioned?.parameters["reason"]?.stringValue?.contains("schemaVersion") == true)
        #expect(error("io.userstore.Admin.ImportStore", ["user": "ivy", "path": .string(bare), "schemaVersion": 99])?.name == "io.userstore.Admin.ImportRefused")
        #expect(files(of: "ivy", in: daemon).isEmpty)

        // An existing store is not replaced without replace.
        let good = daemon.directory.path + "/good.db"
        try fmdbFile(at: good)
        #expect(error("io.userstore.Admin.ImportStore", ["user": "hank", "path": .string(good)])?.name == "io.userstore.Admin.ImportRefused")
        #expect(try client.call("io.userstore.Store.Query", ["user": "hank", "sql": "SELECT title FROM notes"])["rows"] == [["mine"]])
        // Neither a path nor a descriptor.
        #expect(error("io.userstore.Admin.ImportStore", ["user": "ivy"])?.name == "org.varlink.service.InvalidParameter")
        #expect(try client.call("io.userstore.Admin.Verify", ["users": ["hank"]])["failures"] == 0)
        daemon.stop()
    }
}
