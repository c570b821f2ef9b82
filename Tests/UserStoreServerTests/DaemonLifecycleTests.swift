import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

@Suite(.serialized) struct DaemonLifecycleTests {
    @Test func sigtermDuringWriteTrafficExitsZeroAndKeepsEveryAcknowledgedWrite() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let acknowledged = Mutex<[String: [Int64]]>([:])
        let writers = DispatchGroup()
        let socketPath = daemon.socketPath
        let started = DispatchSemaphore(value: 0)
        for writer in 0..<8 {
            writers.enter()
            Thread {
                defer { writers.leave() }
                guard let client = try? VarlinkConnection(path: socketPath) else { return }
                client.setReceiveTimeout(seconds: 30)
                let user = "writer\(writer % 4)"
                var sequence: Int64 = 0
                while true {
                    sequence += 1
                    do {
                        _ = try client.call("io.userstore.Store.Execute", [
                            "user": .string(user), "sql": "INSERT INTO notes (title, body) VALUES (?, ?)",
                            "parameters": [.string("w\(writer)"), .string("\(sequence)")],
                        ])
                    } catch {
                        return // the daemon is stopping: this write was not acknowledged
                    }
                    acknowledged.withLock { $0["\(user)/w\(writer)", default: []].append(sequence) }
                    if sequence == 20 { started.signal() }
                }
            }.start()
        }
        for _ in 0..<8 { started.wait() }
        let status = daemon.stop(signal: SIGTERM)
        writers.wait()
        #expect(status == 0, "\(daemon.stderr)")
        #expect(daemon.notify.waitFor { $0 == "STOPPING=1" })
        #expect(!FileManager.default.fileExists(atPath: daemon.socketPath))

        try daemon.start()
        let client = try daemon.connect()
        let expected = acknowledged.withLock { $0 }
        #expect(expected.values.map(\.count).reduce(0, +) >= 160)
        for (key, sequences) in expected {
            let parts = key.split(separator: "/")
            let rows = try client.call("io.userstore.Store.Query", [
                "user": .string(String(parts[0])), "sql": "SELECT CAST(body AS INTEGER) FROM notes WHERE title = ? ORDER BY id",
                "parameters": [.string(String(parts[1]))],
            ])
            let stored = Set(rows["rows"]?.arrayValue?.compactMap { $0.arrayValue?.first?.integerValue } ?? [])
            #expect(Set(sequences).isSubset(of: stored), "\(key): lost \(Set(sequences).subtracting(stored).sorted().prefix(5))")
        }
        daemon.stop()
    }

    @Test func notifiesSystemdOfReadinessStatusWatchdogAndStopping() throws {
        let daemon = try DaemonHarness()
        try daemon.start(environment: ["WATCHDOG_USEC": "200000"])
        #expect(daemon.notify.lines.contains { $0.hasPrefix("STATUS=Serving") })
        // Pings every 100 ms: wait for three of them.
        let notify = daemon.notify
        #expect(notify.waitFor { _ in notify.lines.filter { $0 == "WATCHDOG=1" }.count >= 3 })
        #expect(daemon.stop() == 0)
        #expect(daemon.notify.waitFor { $0 == "STOPPING=1" })
        let lines = daemon.notify.lines
        let ready = try #require(lines.firstIndex(of: "READY=1"))
        let stopping = try #require(lines.firstIndex(of: "STOPPING=1"))
        #expect(ready < stopping)
    }

    @Test func servesASocketPassedBySystemd() throws {
        let daemon = try DaemonHarness()
        // Binds and listens, puts the socket on fd 3 and execs the daemon with LISTEN_FDS=1 and
        // LISTEN_PID set to its own pid, as systemd does.
        let launcher = """
            import os, socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
            s.bind(sys.argv[1]); s.listen(16)
            if s.fileno() != 3:
                os.dup2(s.fileno(), 3)
            os.set_inheritable(3, True)
            os.environ["LISTEN_FDS"] = "1"
            os.environ["LISTEN_FDNAMES"] = "userstore.sock"
            os.environ["LISTEN_PID"] = str(os.getpid())
            os.execv(sys.argv[2], sys.argv[2:])
            """
        let script = daemon.directory.path + "/activate.py"
        try launcher.write(toFile: script, atomically: true, encoding: .utf8)
        try daemon.start(launcher: ["/usr/bin/python3", script, daemon.socketPath])
        #expect(daemon.stderr.contains("from systemd"))
        #expect(try daemon.connect().call("io.userstore.Store.Open", ["user": "activated"])["schemaVersion"] == 6)
        #expect(daemon.stop() == 0)
        // A socket systemd owns is left in place.
        #expect(FileManager.default.fileExists(atPath: daemon.socketPath))
    }

    @Test func replacesAStaleSocketButNeverALiveOne() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        daemon.stop(signal: SIGKILL) // leaves a stale socket file behind
        #expect(FileManager.default.fileExists(atPath: daemon.socketPath))
        try daemon.start()
        #expect(try daemon.connect().call("org.varlink.service.GetInfo")["product"] == "userstored")

        // A second daemon on the same socket (another data directory) refuses to start.
        let second = try DaemonHarness()
        try second.writeConfig(socketPath: daemon.socketPath)
        try second.start(waitForReady: false)
        #expect(second.waitForExit() == 69)
        #expect(second.stderr.contains("another process is serving it"))
        // And a second daemon on the same data directory refuses too.
        let third = try DaemonHarness()
        try third.writeConfig(dataDirectory: daemon.dataDirectory)
        try third.start(waitForReady: false)
        #expect(third.waitForExit() == 69)
        #expect(third.stderr.contains("data directory is in use"))
        #expect(try daemon.connect().call("org.varlink.service.GetInfo")["product"] == "userstored")
        daemon.stop()
    }

    @Test func sighupAndReloadPickUpANewMigrationWithoutARestart() throws {
        let daemon = try DaemonHarness(migrations: ["0001_a.sql": "CREATE TABLE a (x);"])
        try daemon.start()
        let client = try daemon.connect()
        #expect(try client.call("io.userstore.Store.Open", ["user": "r"])["schemaVersion"] == 1)
        try daemon.addMigration("0002_b.sql", "CREATE TABLE b (x);")
        kill(daemon.pid, SIGHUP)
        #expect(daemon.notify.waitFor { $0 == "RELOADING=1" })
        let notify = daemon.notify
        #expect(notify.waitFor { _ in notify.lines.filter { $0 == "READY=1" }.count >= 2 })
        #expect(try client.call("io.userstore.Store.Open", ["user": "r"])["schemaVersion"] == 2)

        try daemon.addMigration("0003_c.sql", "CREATE TABLE c (x);")
        let reloaded = try client.call("io.userstore.Admin.Reload")
        #expect(reloaded["latestVersion"] == 3)
        #expect(try client.call("io.userstore.Store.Open", ["user": "r"])["appliedVersions"] == [3])

        // A broken file is refused with a named error; the previous migrations stay in force.
        try daemon.addMigration("0004_bad.sql", "CREATE TABLE d (x")
        #expect {
            try client.call("io.userstore.Admin.Reload")
        } throws: { error in
            let error = error as? VarlinkError
            return error?.name == "io.userstore.Admin.InvalidMigrations" && error?.parameters["problems"]?.arrayValue?.first?.stringValue?.contains("0004_bad.sql") == true
        }
        #expect(try client.call("io.userstore.Store.Open", ["user": "new"])["schemaVersion"] == 3)
        daemon.stop()
    }

    @Test(arguments: [
        ("maxOpenStores: lots", "maxOpenStores"),
        ("maxOpenStores: 0", "maxOpenStores"),
        ("maxOpenStore: 10", "maxOpenStore"),
        ("idleTimeoutSeconds: -5", "idleTimeoutSeconds"),
        ("socketMode: \"0666\"", "socketMode"),
        ("migrations:\n  onFailure: ignore", "migrations.onFailure"),
        ("migrations:\n  backupBeforeMigrating: sometimes", "migrations.backupBeforeMigrating"),
        ("migrations:\n  fleetSyncMethod: fdatasync", "migrations.fleetSyncMethod"),
        ("access:\n  adminGroups: [no-such-group-here]", "access.adminGroups"),
        ("replication:\n  replica: \"file:///tmp/replica\"\n  litestreamMetricsAddress: \"unix:/tmp/litestream.sock\"", "replication.litestreamMetricsAddress"),
    ])
    func aBadConfigurationRefusesToStartNamingTheKey(_ line: String, _ key: String) throws {
        let daemon = try DaemonHarness(extraConfig: line)
        try daemon.start(waitForReady: false)
        #expect(daemon.waitForExit() == 78)
        #expect(daemon.stderr.contains("key '\(key)'"), "\(daemon.stderr)")
    }

    @Test func planSaysWhetherAStoreIsCopiedFirstAndWhy() throws {
        let daemon = try DaemonHarness(extraConfig: "migrations:\n  backupBeforeMigrating: auto")
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "ann", "sql": "INSERT INTO notes (title) VALUES ('x')"])
        try daemon.addMigration("0007_color.sql", "ALTER TABLE notes ADD COLUMN color TEXT;")
        _ = try client.call("io.userstore.Admin.Reload")
        let additive = try client.call("io.userstore.Admin.Plan", ["user": "ann"])
        #expect(additive["backup"] == false && additive["backupReason"]?.stringValue?.contains("only adds") == true, "\(additive)")
        #expect(additive["steps"]?.arrayValue?.first?["dataLoss"]?.stringValue == nil)
        try daemon.addMigration("0008_paint.sql", "UPDATE notes SET color = 'red';")
        _ = try client.call("io.userstore.Admin.Reload")
        let rewriting = try client.call("io.userstore.Admin.Plan", ["user": "ann"])
        #expect(rewriting["backup"] == true && rewriting["backupReason"]?.stringValue?.hasPrefix("0008_paint.sql") == true, "\(rewriting)")
        #expect(rewriting["steps"]?.arrayValue?.last?["dataLoss"]?.stringValue?.contains("updates existing rows") == true)
        daemon.stop()
    }

    @Test func environmentVariablesOverrideTheFile() throws {
        let daemon = try DaemonHarness()
        try daemon.start(environment: ["USERSTORED_MAX_OPEN_STORES": "3", "USERSTORED_APP_VERSION": "3.1.4"])
        let status = try daemon.connect().call("io.userstore.Admin.Status")
        #expect(status["maxOpenStores"] == 3 && status["appVersion"] == "3.1.4")
        daemon.stop()
    }

    @Test func aBrokenMigrationsDirectoryRefusesToStartNamingTheFiles() throws {
        let daemon = try DaemonHarness(migrations: ["0001_a.sql": "CREATE TABLE a (x);", "1_b.sql": "SELECT 1;"])
        try daemon.start(waitForReady: false)
        #expect(daemon.waitForExit() == 78)
        #expect(daemon.stderr.contains("0001_a.sql, 1_b.sql"))
    }
}

@Suite(.serialized) struct DaemonStatusAndLoggingTests {
    @Test func fleetMigrationProgressShowsInTheStatusText() throws {
        let daemon = try DaemonHarness(migrations: ["0001_a.sql": "CREATE TABLE a (x);"])
        try daemon.start()
        let client = try daemon.connect()
        for index in 0..<40 { _ = try client.call("io.userstore.Store.Open", ["user": .string("s\(index)")]) }
        try daemon.addMigration("0002_b.sql", "CREATE TABLE b (x);")
        _ = try client.call("io.userstore.Admin.Reload")
        let summary = try client.call("io.userstore.Admin.Migrate", ["all": true])
        #expect(summary["done"] == 40 && summary["migrated"] == 40 && summary["failures"] == 0)
        // The datagrams were sent before the reply; the receiving thread may still be on them.
        #expect(daemon.notify.waitFor { $0 == "STATUS=Migrating 0/40 stores, 0 failed, 0/s" })
        #expect(daemon.notify.waitFor { $0.hasPrefix("STATUS=Migrating 40/40 stores, 0 failed") })
        daemon.stop()
    }

    @Test func automaticLogTargetFollowsSystemdsRule() throws {
        // stderr is a "journal stream" (JOURNAL_STREAM names it) but no native socket exists
        // (private /run/systemd): lines carry <N> priority prefixes.
        let daemon = try DaemonHarness(extraConfig: "")
        try String(contentsOfFile: daemon.configPath, encoding: .utf8).replacingOccurrences(of: "logTarget: stderr", with: "logTarget: auto")
            .write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
        let script = """
            mount -t tmpfs tmpfs /run/systemd
            exec 2>"$LOG"
            export JOURNAL_STREAM="$(stat -L -c '%d:%i' /proc/self/fd/2)"
            "$DAEMON" --config "$CONFIG" & D=$!
            for i in $(seq 3000); do grep -q "notice: ready" "$LOG" && break; kill -0 $D || exit 1; sleep 0.01; done
            grep -q "notice: ready" "$LOG" || { echo "not ready within 30 s" >&2; exit 1; }
            kill -TERM $D; wait $D
            """
        let log = daemon.directory.path + "/prefixed.log"
        let result = try run(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/bash", "-c", script], environment: [
            "LOG": log, "DAEMON": productsDirectory + "/userstored", "CONFIG": daemon.configPath, "SOCKET": daemon.socketPath,
        ])
        #expect(result.status == 0, "\(result.stderr)")
        let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").filter { !$0.hasPrefix("userstored:") }
        #expect(!lines.isEmpty)
        #expect(lines.allSatisfy { $0.hasPrefix("<") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("<5>notice: ready") })

        // Without JOURNAL_STREAM: plain readable lines with a timestamp.
        try daemon.start()
        daemon.stop()
        #expect(daemon.stderr.split(separator: "\n").contains { $0.contains("notice: ready") && !$0.hasPrefix("<") })
    }
}
