import DaemonTestSupport
import Foundation
import Testing
import UserStoreCore
import Varlink

/// Staged releases through the real daemon and CLI (docs/releases.md): only the current step's
/// cohort migrates, lazily and with `migrate --all`; a release halts by itself and serves its
/// failed stores at the version they have; resume and abort.
@Suite(.serialized) struct RolloutTests {
    private func ctl(_ daemon: DaemonHarness, _ arguments: String...) throws -> (status: Int32, stdout: String, stderr: String) {
        try ctl(daemon, arguments)
    }

    private func ctl(_ daemon: DaemonHarness, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        try run([userstorectlPath] + arguments + ["--socket", daemon.socketPath])
    }

    private func status(_ daemon: DaemonHarness) throws -> [String: JSONValue] {
        let result = try ctl(daemon, "release", "status", "--json")
        let object = try JSONParser().parse(Array(result.stdout.utf8))
        return object.objectValue ?? [:]
    }

    /// Two notes per user — the same body for the users whose index `failing` picks, different
    /// ones for the rest — then a release whose unique index on the body fails on the former only.
    private func loadUniqueBodyRelease(_ daemon: DaemonHarness, _ client: VarlinkConnection, users: [String], failing: (Int) -> Bool) throws {
        for (index, user) in users.enumerated() {
            for body in failing(index) ? ["dup", "dup"] : ["a", "b"] {
                _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (body) VALUES (?)", "parameters": [.string(body)]])
            }
        }
        try daemon.addMigration("0002_unique.sql", "CREATE UNIQUE INDEX notes_body ON notes (body);")
        _ = try client.call("io.userstore.Admin.Reload")
    }

    private func schemaVersion(_ client: VarlinkConnection, _ user: String) throws -> Int64? {
        try client.call("io.userstore.Store.Open", ["user": .string(user)])["schemaVersion"]?.integerValue
    }

    @Test func onlyTheCurrentStepsCohortMigratesUntilTheLastStepCompletesIt() throws {
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"])
        try daemon.start()
        let client = try daemon.connect()
        let users = (0..<60).map { "user-\($0)" }
        for user in users { _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (body) VALUES ('x')"]) }
        #expect(try status(daemon)["state"] == "none")
        // No release: status says so in the words `release start` is refused with.
        let none = try ctl(daemon, "release", "status"), refused = try ctl(daemon, "release", "start", "--steps", "100%")
        #expect(none.status == 0 && none.stdout.hasPrefix(Release.noReleaseText + " (schema version 1).\nStores per schema version: v1: 60."), "\(none.stdout)")
        #expect(refused.status == 1 && refused.stderr.contains(Release.noReleaseText), "\(refused.stderr)")

        try daemon.addMigration("0002_pinned.sql", "-- Up\nALTER TABLE notes ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;\n-- Down\nALTER TABLE notes DROP COLUMN pinned;")
        _ = try client.call("io.userstore.Admin.Reload")
        let start = try ctl(daemon, "release", "start", "--canary", "user-59", "--steps", "25%,100%", "--wait", "1h")
        #expect(start.status == 0, "\(start.stdout)\(start.stderr)")
        var release = try status(daemon)
        #expect(release["state"] == "running" && release["step"] == .real(0) && release["staged"] == true)

        // The canary step: user-59 alone migrates, lazily.
        let reached25 = Set(users.filter { Cohort.contains(try! UserID($0), percent: 25, canary: ["user-59"]) })
        #expect(try schemaVersion(client, "user-59") == 2)
        let outsider = users.first { !reached25.contains($0) }!
        #expect(try schemaVersion(client, outsider) == 1)
        #expect(throws: VarlinkError.self) { try client.call("io.userstore.Store.Query", ["user": .string(outsider), "sql": "SELECT pinned FROM notes"]) }

        // 25%: migrate --all migrates that cohort and holds the rest back, exit 0.
        #expect(try ctl(daemon, "release", "next").status == 0)
        let migrate = try ctl(daemon, "migrate", "--all", "--json")
        #expect(migrate.status == 0, "\(migrate.stdout)\(migrate.stderr)")
        let held = migrate.stdout.components(separatedBy: "\"state\":\"held\"").count - 1
        #expect(held == users.count - reached25.count, "\(migrate.stdout)")
        release = try status(daemon)
        #expect(release["step"] == .real(25))
        #expect(release["versions"] == .object(["1": .integer(Int64(held)), "2": .integer(Int64(reached25.count))]))
        #expect(release["storesReached"] == .integer(Int64(reached25.count)) && release["failed"] == [])
        for user in users {
            #expect(try schemaVersion(client, user) == (reached25.contains(user) ? 2 : 1), "\(user)")
        }
        // A new user outside the cohort starts at the version before the release.
        let newcomer = (0..<1000).map { "new-\($0)" }.first { !Cohort.contains(try! UserID($0), percent: 25, canary: []) }!
        #expect(try schemaVersion(client, newcomer) == 1)

        // 100%: everyone, then the release is complete.
        #expect(try ctl(daemon, "release", "next").status == 0)
        let rest = try ctl(daemon, "migrate", "--all")
        #expect(rest.status == 0 && !rest.stdout.contains("held"), "\(rest.stdout)")
        release = try status(daemon)
        #expect(release["state"] == "complete" && release["versions"] == .object(["2": .integer(Int64(users.count + 1))]), "\(release)")
        daemon.stop()
        #expect(daemon.stderr.contains("event=release-started") && daemon.stderr.contains("event=release-complete"))
    }

    @Test func aReleaseHaltsByItselfServesItsFailedStoresAndResumesAfterAFix() throws {
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"],
                                       extraConfig: "rollout:\n  steps: [100%]\n  haltOn: 10%\n  wait: 1h")
        try daemon.start()
        let client = try daemon.connect()
        let users = (0..<20).map { "user-\($0)" }
        // Every fourth user has a duplicate body: a unique index fails on their data only.
        try loadUniqueBodyRelease(daemon, client, users: users, failing: { $0 % 4 == 0 })
        let migrate = try ctl(daemon, "migrate", "--all", "--parallel", "1")
        #expect(migrate.status == 1, "\(migrate.stdout)\(migrate.stderr)")
        var release = try status(daemon)
        #expect(release["state"] == "halted", "\(release)")
        let failed = Set(release["failed"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        #expect(!failed.isEmpty && failed.allSatisfy { Int($0.dropFirst(5))! % 4 == 0 })
        #expect(release["haltReason"]?.stringValue?.contains("haltOn 10%") == true)
        // Every store that failed is reported failed (not "held" by the halt it caused).
        #expect(migrate.stdout.contains("\(failed.count) stores failed:"), "\(migrate.stdout)")
        #expect(try ctl(daemon, "release", "status").status == 1)

        // A failed store is served at the version it has, not refused.
        let failedUser = failed.first!
        #expect(try schemaVersion(client, failedUser) == 1)
        #expect(try client.call("io.userstore.Store.Query", ["user": .string(failedUser), "sql": "SELECT count(*) AS n FROM notes"])["rows"] == [[2]])
        // Halted: nothing more migrates, lazily or eagerly.
        let again = try ctl(daemon, "migrate", "--all", "--json")
        #expect(!again.stdout.contains("\"state\":\"migrated\""), "\(again.stdout)")

        // The fix: a plain index. Stores that applied the unique one accept its new checksum.
        try daemon.addMigration("0002_unique.sql", "CREATE INDEX notes_body ON notes (body);")
        _ = try client.call("io.userstore.Admin.Reload")
        #expect(try status(daemon)["state"] == "halted") // the same versions: the same release
        for user in users where !failed.contains(user) {
            _ = try client.call("io.userstore.Admin.AcceptChecksums", ["user": .string(user)])
        }
        #expect(try ctl(daemon, "release", "resume").status == 0)
        let fixed = try ctl(daemon, "migrate", "--all")
        #expect(fixed.status == 0, "\(fixed.stdout)\(fixed.stderr)")
        release = try status(daemon)
        #expect(release["state"] == "complete" && release["failed"] == [], "\(release)")
        daemon.stop()
        #expect(daemon.stderr.contains("event=release-halted"))
    }

    @Test func anAbortNeedsEveryDownAndThenHoldsEveryStoreAtTheVersionBefore() throws {
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"])
        try daemon.start()
        let client = try daemon.connect()
        for user in ["a", "b", "c"] { _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (body) VALUES ('x')"]) }
        try daemon.addMigration("0002_tags.sql", "-- Up\nCREATE TABLE tags (name TEXT);\n-- Down\nDROP TABLE tags;")
        try daemon.addMigration("0003_index.sql", "CREATE INDEX notes_body ON notes (body);")
        _ = try client.call("io.userstore.Admin.Reload")
        #expect(try ctl(daemon, "migrate", "--all").status == 0)
        let refused = try ctl(daemon, "release", "abort")
        #expect(refused.status != 0 && refused.stderr.contains("IrreversibleRelease") && refused.stderr.contains("0003_index.sql"), "\(refused.stderr)")
        #expect(try schemaVersion(client, "a") == 3)

        try daemon.addMigration("0003_index.sql", "-- Up\nCREATE INDEX notes_body ON notes (body);\n-- Down\nDROP INDEX notes_body;")
        _ = try client.call("io.userstore.Admin.Reload")
        for user in ["a", "b", "c"] { _ = try client.call("io.userstore.Admin.AcceptChecksums", ["user": .string(user)]) }
        let abort = try ctl(daemon, "release", "abort", "--json")
        #expect(abort.status == 0 && abort.stdout.contains("\"rolledBack\":3"), "\(abort.stdout)\(abort.stderr)")
        for user in ["a", "b", "c", "d"] { #expect(try schemaVersion(client, user) == 1, "\(user)") }
        let migrate = try ctl(daemon, "migrate", "--all")
        #expect(migrate.status == 0 && migrate.stdout.contains("4 held"), "\(migrate.stdout)")
        #expect(try status(daemon)["state"] == "aborted")
        // A restart keeps the release where it was.
        daemon.stop()
        try daemon.start()
        #expect(try schemaVersion(try daemon.connect(), "a") == 1)
        #expect(try status(daemon)["state"] == "aborted")
        daemon.stop()
        // With the daemon stopped, a fleet run reads the release and holds the stores back too.
        let offline = try run([userstorectlPath, "migrate", "--all", "--offline", "--config", daemon.configPath])
        #expect(offline.status == 0 && offline.stdout.contains("4 held"), "\(offline.stdout)\(offline.stderr)")
    }

    @Test func aTrialRunsTheMigrationsOnCopiesAndLeavesEveryLiveStoreAsItWas() throws {
        let metricsSocket = try TemporaryDirectory().path + "-metrics.sock"
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"],
                                       extraConfig: "maxOpenStores: 2\nmetrics:\n  listen: unix:\(metricsSocket)\n")
        try daemon.start()
        let client = try daemon.connect()
        let users = (0..<6).map { "user-\($0)" }
        try loadUniqueBodyRelease(daemon, client, users: users, failing: { $0 % 3 == 0 })
        let layout = StoreLayout(dataDirectory: daemon.dataDirectory)
        func fileBytes(_ user: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: layout.storePath(for: try UserID(user)))) }
        // The two stores open now (the last ones written) and the four closed ones.
        let closedBefore = try users.prefix(4).map(fileBytes)
        let metrics = MetricsTests()
        let opensBefore = try metrics.scrape(metricsSocket).value("userstore_store_opens_total", ["kind": "reopened"])

        let trial = try ctl(daemon, ["release", "trial", "--json"] + users)
        #expect(trial.status == 1, "\(trial.stdout)\(trial.stderr)")
        let lines = try trial.stdout.split(separator: "\n").map { try JSONParser().parse(Array($0.utf8)).objectValue ?? [:] }
        let perStore = lines.filter { $0["user"] != nil }
        #expect(Set(perStore.compactMap { $0["user"]?.stringValue }) == Set(users))
        for line in perStore {
            let index = Int(line["user"]!.stringValue!.dropFirst(5))!
            #expect(line["ok"] == .bool(index % 3 != 0), "\(line)")
            #expect((line["bytesBefore"]?.integerValue ?? 0) > 0 && line["milliseconds"] != nil)
            if index % 3 == 0 { #expect(line["error"]?.stringValue?.contains("UNIQUE") == true, "\(line)") }
            else { #expect((line["bytesAfter"]?.integerValue ?? 0) > (line["bytesBefore"]?.integerValue ?? 0), "\(line)") }
        }
        let summary = try #require(lines.last)
        #expect(summary["summary"] == true && summary["failed"] == 2 && summary["predictedFailureRatio"] == .real(2.0 / 6.0), "\(summary)")

        // Nothing live changed: every store is still at version 1, the closed files are the same
        // bytes, no store was opened for it, and the staging folder is empty.
        #expect(try users.prefix(4).map(fileBytes) == closedBefore)
        #expect(try metrics.scrape(metricsSocket).value("userstore_store_opens_total", ["kind": "reopened"]) == opensBefore)
        #expect(try client.call("io.userstore.Admin.Status")["openStores"] == 2)
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: layout.stagingDirectory)) ?? []).isEmpty)
        let sampled = try ctl(daemon, "release", "trial", "--sample", "3", "--json")
        #expect(sampled.stdout.split(separator: "\n").count == 4, "\(sampled.stdout)")
        // The release itself then runs as usual: user-1 migrates, user-0 fails.
        #expect(try schemaVersion(client, "user-1") == 2)
        #expect(throws: VarlinkError.self) { try client.call("io.userstore.Store.Open", ["user": "user-0"]) }
        daemon.stop()
    }
}
