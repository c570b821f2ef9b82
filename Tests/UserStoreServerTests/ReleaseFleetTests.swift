import DaemonTestSupport
import Foundation
import Testing
import UserStoreCore
import Varlink

/// A release on 1,000 stores (docs/releases.md): a trial predicts the failing ones without
/// changing a byte; the release halts during its first step having tried no store outside it,
/// its failed stores are still served; fixed, it walks to 100%; aborted, every store is back.
@Suite(.serialized) struct ReleaseFleetTests {
    static let users = (0..<1000).map { "u\($0)" }
    /// Every 33rd user has data the release's migration fails on (31 stores: 3.1%).
    static func failsOnData(_ user: String) -> Bool { Int(user.dropFirst())! % 33 == 0 }

    private func ctl(_ daemon: DaemonHarness, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        try run([userstorectlPath] + arguments + ["--socket", daemon.socketPath])
    }

    private func jsonLines(_ text: String) throws -> [[String: JSONValue]] {
        try text.split(separator: "\n").map { try JSONParser().parse(Array($0.utf8)).objectValue ?? [:] }
    }

    private func release(_ daemon: DaemonHarness) throws -> [String: JSONValue] {
        try JSONParser().parse(Array(try ctl(daemon, ["release", "status", "--json"]).stdout.utf8)).objectValue ?? [:]
    }

    /// The bytes of every file of every store (database and WAL).
    private func fingerprints(_ daemon: DaemonHarness) throws -> [String: Data] {
        let layout = StoreLayout(dataDirectory: daemon.dataDirectory)
        var result: [String: Data] = [:]
        for user in Self.users {
            let path = layout.storePath(for: try UserID(user))
            for file in [path, path + "-wal"] where FileManager.default.fileExists(atPath: file) {
                result[file] = try Data(contentsOf: URL(fileURLWithPath: file))
            }
        }
        return result
    }

    @Test(.timeLimit(.minutes(10)))
    func aReleaseOnAThousandStoresTriedHaltedFixedWalkedAndAborted() throws {
        let daemon = try DaemonHarness(migrations: ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"],
                                       extraConfig: "rollout:\n  steps: [10%, 100%]\n  haltOn: 1%\n  wait: 1h\n")
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Admin.Migrate", ["users": .array(Self.users.map { .string($0) })])
        for user in Self.users where Self.failsOnData(user) {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (body) VALUES ('dup'), ('dup')"])
        }
        try daemon.addMigration("0002_unique.sql", "CREATE UNIQUE INDEX notes_body ON notes (body);")
        _ = try client.call("io.userstore.Admin.Reload")

        // The trial predicts exactly the failing stores, and no byte of a live store changes.
        let before = try fingerprints(daemon)
        let trial = try ctl(daemon, ["release", "trial", "--sample", "1000", "--parallel", "8", "--json"])
        let tried = try jsonLines(trial.stdout)
        let predicted = Set(tried.filter { $0["ok"] == false }.compactMap { $0["user"]?.stringValue })
        #expect(predicted == Set(Self.users.filter(Self.failsOnData)), "\(trial.stderr)")
        #expect(tried.last?["predictedFailureRatio"] == .real(31.0 / 1000.0))
        #expect(try fingerprints(daemon) == before)

        // The first step: only its cohort is tried, it halts, the failed stores are served.
        let reached = Set(Self.users.filter { Cohort.contains(try! UserID($0), percent: 10, canary: []) })
        let migrate = try ctl(daemon, ["migrate", "--all", "--parallel", "4", "--json"])
        let outcomes = try jsonLines(migrate.stdout).filter { $0["user"] != nil }
        let attempted = outcomes.filter { $0["state"] == "migrated" || $0["state"] == "failed" }.compactMap { $0["user"]?.stringValue }
        #expect(Set(attempted).isSubset(of: reached), "tried outside the step: \(Set(attempted).subtracting(reached))")
        var status = try release(daemon)
        #expect(status["state"] == "halted", "\(status)")
        // Status says so too, and `userstorectl status` shows it on its release line.
        let summary = try client.call("io.userstore.Admin.Status")["release"]?.objectValue ?? [:]
        #expect(summary["state"] == "halted" && summary["id"] == status["id"] && summary["failed"] == .integer(Int64(status["failed"]?.arrayValue?.count ?? -1)),
                "\(summary)")
        let shown = try ctl(daemon, ["status"])
        #expect(shown.stdout.contains("release   \(status["id"]?.stringValue ?? "?") halted   step 10%   version 2"), "\(shown.stdout)")
        let failed = Set(status["failed"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        #expect(!failed.isEmpty && failed.allSatisfy(Self.failsOnData) && failed.isSubset(of: reached))
        for user in failed {
            #expect(try client.call("io.userstore.Store.Open", ["user": .string(user)])["schemaVersion"] == 1)
            #expect(try client.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT count(*) FROM notes"])["rows"] == [[2]])
        }

        // Fixed (a plain index, reversible), resumed, walked to 100% by traffic and migrate --all.
        try daemon.addMigration("0002_unique.sql", "-- Up\nCREATE INDEX notes_body ON notes (body);\n-- Down\nDROP INDEX notes_body;")
        _ = try client.call("io.userstore.Admin.Reload")
        for user in attempted where !failed.contains(user) {
            _ = try client.call("io.userstore.Admin.AcceptChecksums", ["user": .string(user)])
        }
        #expect(try ctl(daemon, ["release", "resume"]).status == 0)
        #expect(try ctl(daemon, ["release", "next"]).status == 0)
        let lazy = Self.users.first { !reached.contains($0) }!
        #expect(try client.call("io.userstore.Store.Open", ["user": .string(lazy)])["schemaVersion"] == 2)
        let rest = try ctl(daemon, ["migrate", "--all", "--parallel", "8"])
        #expect(rest.status == 0, "\(rest.stdout)\(rest.stderr)")
        status = try release(daemon)
        #expect(status["state"] == "complete" && status["versions"] == .object(["2": 1000]), "\(status)")
        #expect(try client.call("io.userstore.Admin.Status")["release"]?.objectValue?["state"] == "complete")

        // Aborted: every store back at version 1, and it stays there.
        let abort = try ctl(daemon, ["release", "abort", "--json"])
        #expect(abort.status == 0 && abort.stdout.contains("\"rolledBack\":1000"), "\(abort.stdout)\(abort.stderr)")
        #expect(try release(daemon)["versions"] == .object(["1": 1000]))
        #expect(try client.call("io.userstore.Store.Open", ["user": .string(lazy)])["schemaVersion"] == 1)

        // The operators' fan-out: one row per store with its user, and no write gets through.
        let counted = try ctl(daemon, ["query", "--all", "--json", "SELECT count(*) AS n FROM notes"])
        #expect(counted.status == 0, "\(counted.stderr)")
        let rows = try jsonLines(counted.stdout).filter { $0["row"] != nil }
        #expect(rows.count == 1000 && Set(rows.compactMap { $0["user"]?.stringValue }) == Set(Self.users))
        #expect(rows.allSatisfy { $0["row"] == .object(["n": Self.failsOnData($0["user"]!.stringValue!) ? 2 : 0]) })
        let csv = try ctl(daemon, ["query", "--users", "u0,u1", "--csv", "SELECT count(*) AS n FROM notes"])
        #expect(csv.stdout.split(separator: "\n").first == "user,n" && csv.stdout.contains("u0,2"), "\(csv.stdout)")
        let write = try ctl(daemon, ["query", "--all", "DELETE FROM notes"])
        #expect(write.status == 1 && write.stderr.contains("1000 stores failed"), "\(write.stderr)")
        #expect(try client.call("io.userstore.Store.Query", ["user": "u0", "sql": "SELECT count(*) FROM notes"])["rows"] == [[2]])
        daemon.stop()
    }
}
