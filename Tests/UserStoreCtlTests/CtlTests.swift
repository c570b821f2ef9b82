import DaemonTestSupport
import Foundation
import Testing
import UserStoreCtl
import Varlink

/// userstorectl, the real binary, against the real daemon.
@Suite(.serialized) struct CtlTests {
    func ctl(_ arguments: [String], socket: String? = nil) throws -> (status: Int32, stdout: String, stderr: String) {
        try run([userstorectlPath] + arguments, environment: socket.map { ["USERSTORE_SOCKET": $0] } ?? [:])
    }

    /// Every subcommand's `--help`, found by walking the SUBCOMMANDS lists from the top: its
    /// prose (everything before USAGE) has no run of spaces inside a line, no trailing space and
    /// no stray backslash — what a lost or doubled line continuation in a discussion leaves.
    @Test func everyHelpPageReadsAsProse() throws {
        var pending: [[String]] = [[]], seen = 0
        while let path = pending.popLast() {
            let help = try ctl(path + ["--help"])
            #expect(help.status == 0, "\(path) --help: \(help.stderr)")
            seen += 1
            let prose = help.stdout.components(separatedBy: "\nUSAGE:").first ?? ""
            for line in prose.split(separator: "\n") {
                let text = line.drop { $0 == " " }
                #expect(!text.contains("   ") && !text.hasSuffix(" "), "userstorectl \(path.joined(separator: " ")) --help: \"\(line)\"")
                // A backslash only before a letter (sqlite3's \q): one before a space or at the end
                // of a line is a doubled line continuation printed as text.
                #expect(!text.hasSuffix("\\") && !text.contains("\\ "), "userstorectl \(path.joined(separator: " ")) --help: \"\(line)\"")
            }
            // "SUBCOMMANDS:" lists each name two spaces in; wrapped abstracts are indented further.
            guard let list = help.stdout.components(separatedBy: "\nSUBCOMMANDS:\n").dropFirst().first else { continue }
            for line in list.split(separator: "\n").prefix(while: { !$0.hasPrefix("  See ") && !$0.isEmpty })
            where line.hasPrefix("  ") && !line.hasPrefix("   ") {
                let name = String(line.dropFirst(2).prefix { $0 != " " })
                if name != "help" { pending.append(path + [name]) }
            }
        }
        #expect(seen > 20, "only \(seen) help pages found")
    }

    /// Every subcommand run into a failing daemon reply prints the reply whole: its name and
    /// each of its parameters (integers, booleans and nested values too) as `key: value`, never
    /// an empty one. The same call is made over the socket here and compared.
    @Test func everyErrorPrintsEveryParameterOfTheReply() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title) VALUES ('x')"])
        let file = daemon.directory.path + "/copy.db"
        _ = try client.call("io.userstore.Admin.Backup", ["user": "alice", "path": .string(file)])
        // (arguments, the method and parameters the subcommand sends)
        let cases: [([String], String, [String: JSONValue], Bool)] = [
            (["sql", "alice", "SELECT * FROM nope"], "io.userstore.Admin.Execute", ["user": "alice", "sql": "SELECT * FROM nope"], false),
            (["sql", "alice", "ATTACH 'x' AS y"], "io.userstore.Admin.Execute", ["user": "alice", "sql": "ATTACH 'x' AS y"], false),
            (["watch", "alice", "--since", "999"], "io.userstore.Store.Watch", ["user": "alice", "since": 999], true),
            (["replication"], "io.userstore.Admin.Replication", [:], false),
            (["import", "alice", file], "io.userstore.Admin.ImportStore", ["user": "alice", "path": .string(file)], false),
            (["rollback", "a+b/c", "--to", "1"], "io.userstore.Admin.Rollback", ["user": "a+b/c", "toVersion": 1], false),
            (["restore", "alice", "nosuch"], "io.userstore.Admin.RestoreStore", ["user": "alice", "backup": "nosuch"], false),
            (["plan", "a/b"], "io.userstore.Admin.Plan", ["user": "a/b"], false),
            (["release", "next"], "io.userstore.Admin.AdvanceRelease", [:], false),
            (["cluster", "move", "1", "elsewhere"], "io.userstore.Admin.MoveBucket", ["bucket": 1, "host": "elsewhere"], false),
        ]
        for (arguments, method, parameters, more) in cases {
            var writer = JSONWriter()
            writer.write(VarlinkCall(method: method, parameters: parameters, more: more).message)
            try client.send(raw: writer.bytes + [0])
            let reply = try client.readReply()
            guard let name = reply.error else {
                Issue.record("\(method) did not fail: \(reply.parameters)")
                continue
            }
            let printed = try ctl(["--socket", daemon.socketPath] + arguments)
            #expect(printed.status != 0, "\(arguments)")
            let short = String(name.split(separator: ".").last!)
            let line = printed.stderr
            #expect(line.contains(short) || short == "PermissionDenied", "\(arguments): \(line) (reply \(name))")
            for (key, value) in reply.parameters {
                let text = value.stringValue ?? value.serialized
                if text.isEmpty {
                    #expect(!line.contains("\(key): ;") && !line.hasSuffix("\(key): \n"), "\(arguments): an empty \(key) printed: \(line)")
                } else {
                    #expect(line.contains("\(key): \(text)"), "\(arguments): \(key) of \(name) missing: \(line)")
                }
            }
        }
        #expect(daemon.stop() == 0)
    }

    /// `userstorectl sql USER` on standard input: several statements on one line run in order;
    /// sqlite3's `.tables`, `.schema [TABLE]` and `.help`; an unknown dot command is named.
    @Test func theShellRunsSeveralStatementsALineAndKnowsDotCommands() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let environment = ["USERSTORE_SOCKET": daemon.socketPath]
        let several = try run([userstorectlPath, "sql", "alice"], environment: environment,
                              input: "CREATE TABLE kv (k TEXT PRIMARY KEY, v); INSERT INTO kv VALUES ('a', 1); SELECT 41 + v AS answer FROM kv;\n")
        #expect(several.status == 0, "\(several.stderr)")
        #expect(several.stdout.contains("answer") && several.stdout.contains("42") && several.stdout.contains("1 row changed"), "\(several.stdout)")
        let dots = try run([userstorectlPath, "sql", "alice"], environment: environment, input: ".tables\n.schema kv\n.help\n")
        #expect(dots.status == 0, "\(dots.stderr)")
        let lines = dots.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains("kv") && lines.contains("notes") && lines.contains("app_version"), "\(dots.stdout)")
        #expect(lines.contains("CREATE TABLE kv (k TEXT PRIMARY KEY, v);"), "\(dots.stdout)")
        #expect(!dots.stdout.contains("CREATE TABLE notes"), "the schema of kv only: \(dots.stdout)")
        #expect(dots.stdout.contains(".schema [TABLE]"), "\(dots.stdout)")
        let unknown = try run([userstorectlPath, "sql", "alice"], environment: environment, input: ".frobnicate\nSELECT 1;\n")
        #expect(unknown.status == 1 && unknown.stderr.contains("unknown command .frobnicate") && !unknown.stdout.contains("1 row"), "\(unknown)")
        // The first failing statement of a line stops a script: the ones after it do not run.
        let stops = try run([userstorectlPath, "sql", "alice"], environment: environment, input: "SELECT * FROM nowhere; INSERT INTO kv VALUES ('b', 2);\n")
        #expect(stops.status == 1 && stops.stderr.contains("no such table: nowhere"), "\(stops)")
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM kv"])["rows"] == [[1]])
        #expect(daemon.stop() == 0)
    }

    /// Integer arguments are exact to the 64-bit bounds and refused beyond them (not sent as reals).
    @Test func integerArgumentsAreExactOrRefused() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let bounds = try ctl(["--socket", daemon.socketPath, "--json", "sql", "alice", "SELECT ?, ?", "--", "9223372036854775807", "-9223372036854775808"])
        #expect(bounds.stdout.contains("[9223372036854775807,-9223372036854775808]"), "\(bounds.stdout) \(bounds.stderr)")
        for number in ["9223372036854775808", "18446744073709551616", "-9223372036854775809"] {
            for command in [["sql", "alice", "SELECT ?", "--", number], ["query", "--users", "alice", "SELECT ?", "--", number]] {
                let refused = try ctl(["--socket", daemon.socketPath] + command)
                #expect(refused.status == 2 && refused.stderr.contains("argument 1 (\(number)) is an integer outside the signed 64-bit range"), "\(command): \(refused)")
            }
        }
        #expect(daemon.stop() == 0)
    }

    @Test(.timeLimit(.minutes(10)))
    func migrateAllOverTwoThousandStoresNamesTheFailureAndFinishesAfterARepair() throws {
        let daemon = try DaemonHarness(migrations: ["0001_t.sql": "CREATE TABLE t (v TEXT);"])
        let users = (0..<2000).map { String(format: "u%04d", $0) }
        // 2,000 stores at version 1, created offline (the daemon is not running yet).
        let created = try ctl(["migrate", "--offline", "--config", daemon.configPath, "--json"] + users)
        #expect(created.status == 0, "\(created.stderr)")
        // Duplicates in one store will break the unique index of migration 3.
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": "u1999", "sql": "INSERT INTO t VALUES ('dup'), ('dup')"])
        #expect(daemon.stop() == 0)
        try daemon.addMigration("0002_w.sql", "ALTER TABLE t ADD COLUMN w INTEGER NOT NULL DEFAULT 0;")
        try daemon.addMigration("0003_unique.sql", "CREATE UNIQUE INDEX t_v ON t (v);")
        // 500 stores current already, 1,500 two versions behind.
        #expect(try ctl(["migrate", "--offline", "--config", daemon.configPath] + users.prefix(500)).status == 0)

        try daemon.start()
        let first = try ctl(["migrate", "--all", "--json"], socket: daemon.socketPath)
        #expect(first.status == 1, "\(first.stderr)")
        let lines = first.stdout.split(separator: "\n").map { try? JSONParser().parse(String($0)) }
        #expect(lines.allSatisfy { $0 != nil }) // every line is JSON
        let stores = lines.compactMap { $0 }.filter { $0["user"] != nil }
        #expect(stores.count == 2000)
        #expect(stores.filter { $0["state"] == "migrated" }.count == 1499)
        #expect(stores.filter { $0["state"] == "current" }.count == 500)
        let failed = stores.filter { $0["state"] == "failed" }
        #expect(failed.count == 1 && failed.first?["user"] == "u1999")
        #expect(failed.first?["error"]?.stringValue?.contains("UNIQUE constraint failed") == true)
        let summary = try #require(lines.last??.objectValue)
        #expect(summary["summary"] == true && summary["failures"] == 1 && summary["done"] == 2000)

        // Human output names the failing store and its error too.
        let again = try ctl(["migrate", "--all"], socket: daemon.socketPath)
        #expect(again.status == 1)
        #expect(again.stdout.contains("  u1999: store 'u1999': migration 3 (0003_unique.sql) failed: UNIQUE constraint failed: t.v"))
        #expect(!again.stdout.contains("\r")) // piped: no progress bar

        let repair = try ctl(["sql", "u1999", "DELETE FROM t WHERE rowid NOT IN (SELECT min(rowid) FROM t GROUP BY v)"], socket: daemon.socketPath)
        #expect(repair.status == 0 && repair.stdout.contains("1 row changed"), "\(repair.stderr)")
        let last = try ctl(["migrate", "--all"], socket: daemon.socketPath)
        #expect(last.status == 0, "\(last.stdout)\(last.stderr)")
        #expect(last.stdout.contains("2000/2000 stores") && last.stdout.contains("1 migrated") && last.stdout.contains("1999 current"))
        let verify = try ctl(["verify", "u0000", "u1999", "--json"], socket: daemon.socketPath)
        #expect(verify.status == 0, "\(verify.stdout)")

        // On a terminal, a live progress bar.
        let tty = try run(["/usr/bin/script", "-q", "-e", "-c", "\(userstorectlPath) migrate --all --socket \(daemon.socketPath)", "/dev/null"])
        #expect(tty.status == 0)
        #expect(tty.stdout.contains("\r[") && tty.stdout.contains("2000/2000 100%"))

        // Ctrl-C once the first store is reported: exit 130, a summary that says so, and the
        // daemon starts no more stores (most are still pending).
        try daemon.addMigration("0004_x.sql", "ALTER TABLE t ADD COLUMN x INTEGER;")
        #expect(try daemon.connect().call("io.userstore.Admin.Reload")["latestVersion"] == 4)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: userstorectlPath)
        process.arguments = ["migrate", "--all", "--json", "--parallel", "1", "--socket", daemon.socketPath]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = Pipe()
        try process.run()
        var printed = Data()
        while !String(decoding: printed, as: UTF8.self).contains("\"user\"") {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            printed.append(chunk)
        }
        kill(process.processIdentifier, SIGINT)
        printed.append(output.fileHandleForReading.readDataToEndOfFile())
        process.waitUntilExit()
        #expect(process.terminationStatus == 130)
        let interruptedSummary = try JSONParser().parse(String(try #require(String(decoding: printed, as: UTF8.self).split(separator: "\n").last)))
        #expect(interruptedSummary["interrupted"] == true)
        let status = try JSONParser().parse(try ctl(["status", "--json"], socket: daemon.socketPath).stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect((status["pendingStores"]?.integerValue ?? 0) > 1000, "\(status)")
        daemon.stop()
    }

    @Test func statusListPlanAndSqlWorkAndJSONParses() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Open", ["user": "ann"])
        let status = try ctl(["status", "--json"], socket: daemon.socketPath)
        let parsed = try JSONParser().parse(status.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(parsed["knownStores"] == 1 && parsed["latestSchemaVersion"] == 6)
        let human = try ctl(["--socket", daemon.socketPath, "status"])
        #expect(human.status == 0 && human.stdout.contains("1 known") && human.stdout.contains("schema 6"))
        let list = try ctl(["list", "--json", "--state", "current"], socket: daemon.socketPath)
        #expect(try JSONParser().parse(list.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["user"] == "ann")
        let plan = try ctl(["plan", "bob"], socket: daemon.socketPath)
        #expect(plan.stdout.contains("-- 0006_title_limit.sql (version 6)") && plan.stdout.contains("CREATE TABLE notes_new"))
        #expect(!FileManager.default.fileExists(atPath: daemon.dataDirectory + "/stores") || !(FileManager.default.enumerator(atPath: daemon.dataDirectory + "/stores")?.allObjects.contains { "\($0)".hasSuffix("bob.sqlite") } ?? false))
        let insert = try ctl(["sql", "ann", "INSERT INTO notes (title, pinned) VALUES (?, ?)", "hello", "1"], socket: daemon.socketPath)
        #expect(insert.stdout.contains("1 row changed"))
        let select = try ctl(["sql", "ann", "SELECT title, pinned FROM notes"], socket: daemon.socketPath)
        #expect(select.stdout.contains("hello  1"))
        let bookkeeping = try ctl(["sql", "ann", "DELETE FROM schema_migrations"], socket: daemon.socketPath)
        #expect(bookkeeping.status == 1 && bookkeeping.stderr.contains("bookkeeping"))
        let backup = try ctl(["backup", "ann", "--output", daemon.directory.path + "/ann-copy.sqlite"], socket: daemon.socketPath)
        #expect(backup.status == 0 && FileManager.default.fileExists(atPath: daemon.directory.path + "/ann-copy.sqlite"))
        daemon.stop()
    }

    @Test func offlineRefusesWhileTheDaemonRunsAndWorksWhenItDoesNot() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Open", ["user": "carl"])
        for command in [["status"], ["verify", "--all"], ["migrate", "--all"]] {
            let refused = try ctl(command + ["--offline", "--config", daemon.configPath])
            #expect(refused.status == 3)
            #expect(refused.stderr.contains("holds the data directory"))
        }
        #expect(daemon.stop() == 0)
        let status = try ctl(["status", "--offline", "--config", daemon.configPath, "--json"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(try JSONParser().parse(status.stdout.trimmingCharacters(in: .whitespacesAndNewlines))["currentStores"] == 1)
        #expect(try ctl(["verify", "--all", "--offline", "--config", daemon.configPath]).status == 0)
        try daemon.addMigration("0007_more.sql", "CREATE TABLE more (x);")
        let migrated = try ctl(["migrate", "--all", "--offline", "--config", daemon.configPath])
        #expect(migrated.status == 0 && migrated.stdout.contains("1 migrated"), "\(migrated.stdout)\(migrated.stderr)")
    }

    @Test func anUnreachableSocketExitsThreeNamingIt() throws {
        let result = try ctl(["status", "--socket", "/nonexistent/userstore.sock"])
        #expect(result.status == 3)
        #expect(result.stderr.contains("/nonexistent/userstore.sock"))
        #expect(result.stderr.split(separator: "\n").count == 1)
        let usage = try ctl(["migrate"])
        #expect(usage.status == 2)
    }

    /// The shared options come before any subcommand, nested ones included: every command of
    /// the tree (read from the binary's own `--experimental-dump-help`) is run with `--socket`
    /// and `--json` first and must use that socket (exit 3, naming it) — not refuse the option
    /// (exit 2). A command added later without a row here fails the test.
    @Test func sharedOptionsComeBeforeEverySubcommand() throws {
        let minimalArguments: [String: [String]] = [
            "status": [], "list": [], "migrate": ["--all"], "plan": ["ann"], "verify": ["--all"],
            "rollback": ["ann", "--to", "1"], "backup": ["ann"], "backups": ["ann"], "restore": ["ann", "--from-replica"],
            "export": ["ann"], "import": ["ann", "/nonexistent/ann.sqlite"], "delete": ["ann", "--yes"], "top": [],
            "sql": ["ann", "SELECT 1"], "accept-checksums": ["ann"],
            "replication show": [], "replication init": [], "replication take-over": [],
            "cluster status": [], "cluster move": ["1", "host-b"], "cluster drain": ["host-b"], "cluster rebalance": [],
            "release status": [], "release start": ["--steps", "10%,100%"], "release next": [], "release resume": [], "release abort": [], "release trial": [], "query": ["--all", "SELECT 1"], "watch": ["ann"],
            "keys rotate": ["ann"], "encrypt": ["--all"],
        ]
        // `keys rewrap` works on a key store with the daemon stopped: a new, empty one here.
        let keys = try TemporaryDirectory()
        try FileManager.default.createDirectory(atPath: keys.path + "/store", withIntermediateDirectories: true)
        for name in ["old", "new"] {
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: keys.path + "/" + name))
        }
        try """
            appVersion: "1.0.0"
            dataDirectory: \(keys.path)/data
            migrationsDirectory: \(repositoryRoot)/config/migrations
            encryption:
              keyFile: \(keys.path)/old
              keyStore: file://\(keys.path)/store
            """.write(toFile: keys.path + "/userstored.yaml", atomically: true, encoding: .utf8)
        let daemonless: [String: [String]] = [
            "migrations check": [repositoryRoot + "/config/migrations"],
            "keys rewrap": ["--config", keys.path + "/userstored.yaml", "--new-key-file", keys.path + "/new"],
        ]
        let tree = try JSONParser().parse(try ctl(["--experimental-dump-help"]).stdout)
        func leaves(_ command: JSONValue, _ path: [String]) -> [[String]] {
            let children = command["subcommands"]?.arrayValue ?? []
            if children.isEmpty { return [path] }
            return children.flatMap { leaves($0, path + [$0["commandName"]?.stringValue ?? ""]) }
        }
        let commands = leaves(tree["command"] ?? .null, []).filter { $0 != ["help"] }
        #expect(commands.count == minimalArguments.count + daemonless.count)
        let socket = "/nonexistent/shared-options.sock"
        for command in commands {
            let name = command.joined(separator: " ")
            if let arguments = daemonless[name] {
                let result = try ctl(["--socket", socket, "--json"] + command + arguments)
                #expect(result.status == 0, "\(name): \(result.stderr)")
                continue
            }
            guard let arguments = minimalArguments[name] else {
                Issue.record("no row for `userstorectl \(name)`: add its minimal arguments")
                continue
            }
            for leading in [["--socket", socket, "--json"], ["--json", "--socket=\(socket)"]] {
                let result = try ctl(leading + command + arguments)
                #expect(result.status == 3 && result.stderr.contains(socket), "userstorectl \((leading + command + arguments).joined(separator: " ")): exit \(result.status): \(result.stderr)")
            }
        }
    }

    @Test func aCheckoutsDevelopmentDaemonIsFoundWithoutAFlagAndTheErrorNamesWhereItLooked() throws {
        let daemon = try DaemonHarness()
        let checkout = daemon.directory.path + "/checkout"
        try FileManager.default.createDirectory(atPath: checkout + "/.run", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: checkout + "/Sources/deep", withIntermediateDirectories: true)
        try daemon.writeConfig(socketPath: checkout + "/.run/userstore.sock")
        try daemon.start()
        let command = ["/bin/sh", "-c", "cd \"$1\" && unset USERSTORE_SOCKET && exec \"$2\" status --json", "sh", checkout + "/Sources/deep", userstorectlPath]
        let found = try run(command)
        #expect(found.status == 0, "\(found.stderr)")
        #expect(found.stdout.contains(daemon.dataDirectory), "\(found.stdout)")
        daemon.stop()
        let missing = try run(command)
        #expect(missing.status == 3, "\(missing.stdout)\(missing.stderr)")
        #expect(missing.stderr.contains(".run/userstore.sock in \(checkout)/Sources/deep") && missing.stderr.contains("/run/userstore/userstore.sock"), "\(missing.stderr)")
    }

    @Test func migrationsCheckCatchesProblemsAndPassesTheExample() throws {
        let directory = try TemporaryDirectory()
        func fixture(_ name: String, _ files: [String: String]) throws -> String {
            let path = directory.path + "/" + name
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            for (file, sql) in files { try sql.write(toFile: path + "/" + file, atomically: true, encoding: .utf8) }
            return path
        }
        let duplicate = try fixture("duplicate", ["0001_a.sql": "CREATE TABLE a (x);", "1_b.sql": "CREATE TABLE b (x);"])
        let syntax = try fixture("syntax", ["0001_a.sql": "CREATE TABLE a (x);", "0002_b.sql": "CREATE TABLE b (x INTEGER,);"])
        let missingTable = try fixture("missing", ["0001_a.sql": "CREATE TABLE a (x);", "0002_b.sql": "INSERT INTO nowhere VALUES (1);"])
        let dropColumn = try fixture("drop", ["0001_a.sql": "CREATE TABLE a (x, y);", "0002_b.sql": "ALTER TABLE a DROP COLUMN y;"])
        let padding = try fixture("padding", ["9_a.sql": "CREATE TABLE a (x);", "10_b.sql": "CREATE TABLE b (x);"])
        let vacuum = try fixture("vacuum", ["0001_a.sql": "CREATE TABLE a (x);\nVACUUM;"])
        let compatible = try fixture("compatible", ["0001_a.sql": "CREATE TABLE a (x);", "0002_b.sql": "-- Compatible\nALTER TABLE a RENAME TO b;"])
        let expectations: [(String, String)] = [
            (duplicate, "duplicate version 1"), (syntax, "0002_b.sql: error: Up statement 1"), (missingTable, "no such table: nowhere"),
            (dropColumn, "drops column y"), (padding, "do not sort in version order"), (vacuum, "VACUUM cannot run inside a transaction"),
            (compatible, "marked '-- Compatible' but"),
        ]
        for (path, expected) in expectations {
            let result = try ctl(["migrations", "check", path])
            #expect(result.status == 1, "\(path)")
            #expect(result.stdout.contains(expected), "\(path): \(result.stdout)")
        }
        #expect(try ctl(["migrations", "check", "--allow-destructive", dropColumn]).status == 0)
        let example = try ctl(["migrations", "check", repositoryRoot + "/config/migrations"])
        #expect(example.status == 0, "\(example.stdout)")
        #expect(example.stdout.contains("ok"))
    }

    @Test(.timeLimit(.minutes(3)))
    func watchPrintsEachCommittedChangeAsAJSONLineAndALostPositionExitsOne() throws {
        let daemon = try DaemonHarness(migrations: ["0001_t.sql": "CREATE TABLE t (v TEXT);"])
        try daemon.start()
        let client = try daemon.connect()
        // Watched once: from then on the store records its changes.
        let first = try daemon.connect()
        try first.send(VarlinkCall(method: "io.userstore.Store.Watch", parameters: ["user": "tail"], more: true))
        #expect(try first.readReply().parameters["ready"] == true)
        for value in ["one", "two"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": "tail", "sql": "INSERT INTO t VALUES (?)", "parameters": [.string(value)]])
        }
        // From position 0: ready, then both transactions; it follows until stopped (here by
        // timeout(1) after 3 s).
        let watched = try run(["/usr/bin/timeout", "-s", "KILL", "3", userstorectlPath, "watch", "tail", "--since", "0", "--values", "--socket", daemon.socketPath])
        #expect([9, 137].contains(watched.status), "\(watched)") // killed by timeout(1) (SIGKILL: the test process may hand SIGTERM down ignored)
        let lines = watched.stdout.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        #expect(lines.count == 3, "\(watched.stdout)")
        #expect(lines.first?["ready"] as? Bool == true && lines.first?["position"] as? Int == 2)
        #expect(lines.dropFirst().map { $0["position"] as? Int } == [1, 2])
        let last = try #require(lines.last?["changes"] as? [[String: Any]])
        #expect(last.first?["operation"] as? String == "insert" && (last.first?["values"] as? [String: Any])?["v"] as? String == "two", "\(watched.stdout)")

        let lost = try ctl(["watch", "tail", "--since", "7"], socket: daemon.socketPath)
        #expect(lost.status == 1 && lost.stderr.contains("PositionLost"), "\(lost)")
    }

}

@Suite struct CtlCompletionTests {
    @Test(arguments: ["bash", "zsh", "fish"])
    func completionScriptsNameEverySubcommand(_ shell: String) throws {
        let result = try run([userstorectlPath, "--generate-completion-script", shell])
        #expect(result.status == 0)
        for subcommand in ["status", "list", "migrate", "plan", "verify", "rollback", "backup", "sql", "accept-checksums", "migrations"] {
            #expect(result.stdout.contains(subcommand), "\(shell): \(subcommand)")
        }
    }

}
