import DaemonTestSupport
import CChildProcess
import Foundation
import Testing
import Varlink

/// The durable rule (docs/replication.md): a durable reply is sent only when every transaction
/// committed to that store before it is in the replica — under Litestream paused, paused across
/// the point where the old daemon checkpointed behind it, killed, killed for not answering, slowed
/// by a replica that stalls, or the store evicted in between. Each fault ends with the host lost:
/// daemon and Litestream SIGKILLed, the data directory deleted, a new daemon restoring the user on
/// first request — and the restored store must hold exactly what the live one held at the last
/// durable acknowledgement, as an independent `sqlite3 .dump` of both files shows.
@Suite(.serialized) struct DurabilityTests {
    /// A replicating daemon with a 3 s durable time-out, started.
    static func started(extra: String = "") throws -> (replica: TemporaryDirectory, daemon: DaemonHarness, client: VarlinkConnection) {
        try ReplicationTests.started(extra: "  durableTimeoutMilliseconds: 3000\n" + extra)
    }

    /// Runs `sql` in `user`'s store (durably or not); throws the daemon's named error.
    @discardableResult
    static func execute(_ sql: String, for user: String, on client: VarlinkConnection, durable: Bool = false) throws -> [String: JSONValue] {
        var parameters: [String: JSONValue] = ["user": .string(user), "sql": .string(sql)]
        if durable { parameters["durable"] = true }
        return try client.call("io.userstore.Store.Execute", parameters)
    }

    /// Asks `Status` until `condition` holds of its `replication` (one round trip between looks,
    /// at most 60 s); returns whether it did.
    static func waitForReplication(_ client: VarlinkConnection, _ condition: ([String: JSONValue]) -> Bool) throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            if condition(try client.call("io.userstore.Admin.Status")["replication"]?.objectValue ?? [:]) { return true }
        }
        return false
    }

    /// Replication is `ok` again with every open store registered (and so compared with its
    /// replica after the fault).
    static func waitUntilHealthy(_ client: VarlinkConnection) throws -> Bool {
        try waitForReplication(client) { $0["state"] == "ok" && $0["unregisteredStores"] == 0 }
    }

    /// `user`'s store file in `daemon`'s data directory.
    static func storePath(_ user: String, _ daemon: DaemonHarness) throws -> String {
        try run(["/usr/bin/find", daemon.dataDirectory + "/stores", "-name", "\(user).sqlite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Everything the application keeps in the file at `path`, by an independent `sqlite3`: the
    /// schema and every row of every table but Litestream's own (`.dump`, read-only).
    static func contents(_ path: String) throws -> String {
        let tables = try run(["/usr/bin/sqlite3", "-readonly", path,
                              "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_litestream_%' ORDER BY name"])
            .stdout.split(separator: "\n").map(String.init)
        let dump = try run(["/usr/bin/sqlite3", "-readonly", path, ".dump " + tables.joined(separator: " ")])
        #expect(dump.status == 0, "\(dump.stderr)")
        return dump.stdout
    }

    /// Loses the host (daemon and Litestream SIGKILLed, the data directory deleted), starts a new
    /// daemon on the same replica and returns what `user`'s store holds once its first request
    /// restored it.
    static func loseHostAndRestore(_ user: String, _ daemon: DaemonHarness, _ client: VarlinkConnection) throws -> String {
        // Litestream, when the daemon runs it (a suite on the log engine runs none).
        let litestream = Int32(try client.call("io.userstore.Admin.Status")["replication"]?["litestreamPid"]?.integerValue ?? 0)
        kill(daemon.pid, SIGKILL)
        if litestream > 0 { kill(litestream, SIGKILL) }
        daemon.waitForExit()
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let opened = try daemon.connect().call("io.userstore.Store.Open", ["user": .string(user)])
        #expect(opened["created"] == false, "\(user) was created empty instead of restored")
        return try contents(try storePath(user, daemon))
    }

    static func expectSame(_ restored: String, _ live: String, _ sourceLocation: SourceLocation = #_sourceLocation) {
        let missing = Set(live.split(separator: "\n")).subtracting(restored.split(separator: "\n"))
        #expect(restored == live, "the restored store differs from the live one; lines missing: \(missing.map { String($0.prefix(120)) }.sorted().prefix(8))",
                sourceLocation: sourceLocation)
    }

    /// A table `blobs` in `user`'s store and one random blob of `bytes` in it (plain writes).
    static func writeBlob(_ bytes: Int, for user: String, on client: VarlinkConnection) throws {
        try execute("CREATE TABLE blobs (b BLOB)", for: user, on: client)
        try execute("INSERT INTO blobs VALUES (randomblob(\(bytes)))", for: user, on: client)
    }

    /// The end of every fault: a durable write acknowledged, then the host lost — and the store
    /// restored on the next host must hold what the live one held at that acknowledgement.
    static func acknowledgeThenLoseTheHost(_ user: String, _ daemon: DaemonHarness, _ client: VarlinkConnection,
                                           _ sourceLocation: SourceLocation = #_sourceLocation) throws {
        try execute("INSERT INTO notes (title) VALUES ('after')", for: user, on: client, durable: true)
        let live = try contents(try storePath(user, daemon))
        #expect(live.contains("CREATE TABLE blobs"), sourceLocation: sourceLocation)
        expectSame(try loseHostAndRestore(user, daemon, client), live, sourceLocation)
        daemon.stop()
    }

    /// The issue's scenario: Litestream paused (SIGSTOP) while small and large transactions
    /// commit — a 5 MB one, a durable write that fails, plain writes for 9 s — then resumed; a
    /// durable write acknowledged afterwards means the 5 MB transaction is in the replica too.
    @Test(.litestreamBehaviour) func aPausedLitestreamLosesNoCommitBeforeADurableAcknowledgement() throws {
        let (_, daemon, client) = try Self.started()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "ann", on: client, durable: true)
        let litestream = try ReplicationTests.litestreamPID(client)
        kill(litestream, SIGSTOP)
        defer { kill(litestream, SIGCONT) }
        for index in 0..<5 { try Self.execute("INSERT INTO notes (title) VALUES ('plain \(index)')", for: "ann", on: client) }
        try Self.writeBlob(5242880, for: "ann", on: client)
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            try Self.execute("INSERT INTO notes (title) VALUES ('durable while paused')", for: "ann", on: client, durable: true)
        })
        let until = ContinuousClock.now + .seconds(9)
        var written = 0
        while ContinuousClock.now < until {
            try Self.execute("INSERT INTO notes (title) VALUES ('during \(written)')", for: "ann", on: client)
            written += 1
        }
        kill(litestream, SIGCONT)
        #expect(try Self.waitUntilHealthy(client))
        try Self.execute("INSERT INTO notes (title) VALUES ('after')", for: "ann", on: client, durable: true)
        let live = try Self.contents(try Self.storePath("ann", daemon))
        #expect(live.contains("CREATE TABLE blobs") && live.contains("'during \(written - 1)'"))
        Self.expectSame(try Self.loseHostAndRestore("ann", daemon, client), live)
        daemon.stop()
    }

    /// Paused past the point where the daemon used to checkpoint a store behind Litestream (the
    /// health check has given up on it, the WAL is past 1,000 pages, one more commit): the WAL
    /// is kept whole, because the paused Litestream still holds its position in it. Before the
    /// fix the WAL was reset here, Litestream took that for its own checkpoint, and the 5 MB
    /// write never reached the replica (every run).
    @Test(.litestreamBehaviour) func aStoreIsNotCheckpointedBehindAPausedLitestream() throws {
        let (_, daemon, client) = try Self.started()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "bea", on: client, durable: true)
        let litestream = try ReplicationTests.litestreamPID(client)
        kill(litestream, SIGSTOP)
        defer { kill(litestream, SIGCONT) }
        try Self.writeBlob(5242880, for: "bea", on: client)
        #expect(try Self.waitForReplication(client) { $0["unregisteredStores"] == 1 })
        try Self.execute("INSERT INTO notes (title) VALUES ('small')", for: "bea", on: client)
        let wal = try Self.storePath("bea", daemon) + "-wal"
        let walSize = (try FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0
        #expect(walSize > 5_242_880, "the WAL was reset behind the paused Litestream (\(walSize) bytes left); Litestream \(litestream), daemon's log:\n\(daemon.stderr.split(separator: "\n").suffix(30).joined(separator: "\n"))")
        kill(litestream, SIGCONT)
        #expect(try Self.waitUntilHealthy(client))
        try Self.acknowledgeThenLoseTheHost("bea", daemon, client)
    }

    /// A WAL reset the daemon cannot prevent — another process checkpoints the store while
    /// Litestream is paused — breaks the replica's continuity just the same. The comparison after
    /// the fault finds it (`replica-diverged`), ships the store whole again, and only then counts
    /// it as registered: the durable write after it is acknowledged with everything before it in
    /// the replica.
    @Test(.litestreamBehaviour) func aBrokenReplicaIsFoundAndShippedWholeAgain() throws {
        let (_, daemon, client) = try Self.started()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "cal", on: client, durable: true)
        let litestream = try ReplicationTests.litestreamPID(client)
        kill(litestream, SIGSTOP)
        defer { kill(litestream, SIGCONT) }
        try Self.writeBlob(3000000, for: "cal", on: client)
        #expect(try Self.waitForReplication(client) { $0["unregisteredStores"] == 1 })
        let path = try Self.storePath("cal", daemon)
        let checkpoint = try run(["/usr/bin/sqlite3", "-cmd", ".timeout 5000", path, "PRAGMA wal_checkpoint(TRUNCATE);"])
        #expect(checkpoint.stdout.hasPrefix("0|0|0"), "\(checkpoint)")
        try Self.execute("INSERT INTO notes (title) VALUES ('small')", for: "cal", on: client)
        kill(litestream, SIGCONT)
        #expect(try Self.waitUntilHealthy(client))
        #expect(daemon.stderr.contains("event=replica-diverged"), "the broken replica went unnoticed")
        #expect(try client.call("io.userstore.Admin.Status")["replication"]?["divergedReplicas"] == 1)
        try Self.acknowledgeThenLoseTheHost("cal", daemon, client)
    }

    /// Litestream killed while a large and small transactions commit: the daemon starts a new
    /// one, registers the store with it and compares it with its replica; a durable write then
    /// covers everything.
    @Test(.litestreamBehaviour) func aKilledLitestreamLosesNothingAcknowledged() throws {
        let (_, daemon, client) = try Self.started()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "dan", on: client, durable: true)
        let first = try ReplicationTests.litestreamPID(client)
        kill(first, SIGKILL)
        try Self.writeBlob(5242880, for: "dan", on: client)
        for index in 0..<20 { try Self.execute("INSERT INTO notes (title) VALUES ('while down \(index)')", for: "dan", on: client) }
        #expect(try Self.waitForReplication(client) { $0["state"] == "ok" && $0["unregisteredStores"] == 0 && $0["litestreamPid"]?.integerValue != Int64(first) })
        try Self.acknowledgeThenLoseTheHost("dan", daemon, client)
    }

    /// A Litestream child that stops answering is killed after
    /// `replication.restartUnresponsiveSeconds` and replaced; its stores, whose WAL it held, are
    /// registered with the new one and compared with their replica.
    @Test(.litestreamBehaviour) func anUnresponsiveLitestreamIsReplaced() throws {
        let (_, daemon, client) = try Self.started(extra: "  restartUnresponsiveSeconds: 2")
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "eve", on: client, durable: true)
        let first = try ReplicationTests.litestreamPID(client)
        kill(first, SIGSTOP)
        try Self.writeBlob(5242880, for: "eve", on: client)
        #expect(try Self.waitForReplication(client) { $0["state"] == "ok" && $0["unregisteredStores"] == 0 && $0["litestreamPid"]?.integerValue != Int64(first) })
        #expect(daemon.stderr.contains("event=litestream-unresponsive"))
        #expect(us_wait_for_exit(first, 0) == 1, "the paused Litestream is still there")
        try Self.acknowledgeThenLoseTheHost("eve", daemon, client)
    }

    /// A store evicted while Litestream is paused: its final sync and unregistration time out,
    /// so it is closed with its WAL kept (the paused Litestream still holds its position in it).
    /// Reopened after Litestream is back, it is compared with its replica before a durable write
    /// is acknowledged.
    @Test(.litestreamBehaviour) func aStoreEvictedWhileLitestreamIsPausedLosesNothing() throws {
        let (_, daemon, client) = try Self.started(extra: "maxOpenStores: 2")
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "fay", on: client, durable: true)
        let litestream = try ReplicationTests.litestreamPID(client)
        kill(litestream, SIGSTOP)
        defer { kill(litestream, SIGCONT) }
        try Self.writeBlob(5242880, for: "fay", on: client)
        // Two other users: fay, least recently used, is closed.
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"])
        _ = try client.call("io.userstore.Store.Open", ["user": "hal"])
        let open = try client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
        #expect(!open.contains("fay"))
        let wal = try Self.storePath("fay", daemon) + "-wal"
        #expect(((try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0) > 5_242_880, "closing reset the WAL the paused Litestream holds")
        kill(litestream, SIGCONT)
        try Self.execute("INSERT INTO notes (title) VALUES ('reopened')", for: "fay", on: client)
        #expect(try Self.waitUntilHealthy(client))
        try Self.acknowledgeThenLoseTheHost("fay", daemon, client)
    }

    /// A replica on a file system that stalls (`fsfreeze` on a loop-mounted ext4): Litestream
    /// answers but cannot ship; durable writes fail within their time-out, plain ones go on; once
    /// the file system thaws, a durable write covers everything.
    @Test(.enabled(if: getuid() == 0, "mounts a file system")) func aStalledReplicaDelaysButLosesNothing() throws {
        let scratch = try TemporaryDirectory()
        let image = scratch.path + "/replica.img", mountPoint = scratch.path + "/replica"
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        #expect(try run(["/usr/bin/truncate", "-s", "128M", image]).status == 0)
        #expect(try run(["/sbin/mkfs.ext4", "-q", image]).status == 0)
        let mount = try run(["/bin/mount", "-o", "loop", image, mountPoint])
        try #require(mount.status == 0, "\(mount.stderr)")
        var frozen = false
        defer {
            if frozen { _ = try? run(["/sbin/fsfreeze", "-u", mountPoint]) }
            _ = try? run(["/bin/umount", "-l", mountPoint])
        }
        let daemon = try ReplicationTests.daemon(replica: mountPoint, extra: "  durableTimeoutMilliseconds: 2000")
        try daemon.start()
        let client = try daemon.connect()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "ida", on: client, durable: true)
        #expect(try run(["/sbin/fsfreeze", "-f", mountPoint]).status == 0)
        frozen = true
        try Self.writeBlob(2000000, for: "ida", on: client)
        let started = ContinuousClock.now
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            try Self.execute("INSERT INTO notes (title) VALUES ('durable while stalled')", for: "ida", on: client, durable: true)
        })
        let waited = ContinuousClock.now - started
        #expect(waited < .milliseconds(2200), "a durable write waited \(waited) against a 2 s time-out")
        for index in 0..<20 { try Self.execute("INSERT INTO notes (title) VALUES ('stalled \(index)')", for: "ida", on: client) }
        #expect(try run(["/sbin/fsfreeze", "-u", mountPoint]).status == 0)
        frozen = false
        // Litestream catches up: durable writes are acknowledged again once it has.
        #expect(try Self.waitForReplication(client) { $0["state"] == "ok" && $0["unregisteredStores"] == 0 })
        var caughtUp = false
        let deadline = ContinuousClock.now + .seconds(60)
        while !caughtUp && ContinuousClock.now < deadline {
            caughtUp = (try? Self.execute("INSERT INTO notes (title) VALUES ('caught up')", for: "ida", on: client, durable: true)) != nil
        }
        #expect(caughtUp)
        try Self.acknowledgeThenLoseTheHost("ida", daemon, client)
    }

    /// The data directory's disk full (a loop-mounted ext4 filled by another file): writes are
    /// refused by name (`StorageFailure`) — a durable one too, never acknowledged — reads and the
    /// daemon go on; once space is back, writes and durable writes go through again, and after
    /// the disk is lost the store is what it was at the last acknowledgement.
    @Test(.enabled(if: getuid() == 0, "mounts a file system")) func aFullDiskRefusesWritesByNameAndLosesNothingAcknowledged() throws {
        let replica = try TemporaryDirectory()
        let daemon = try ReplicationTests.daemon(replica: replica.path, extra: "  durableTimeoutMilliseconds: 3000")
        daemon.retained.append(replica)
        let scratch = try TemporaryDirectory()
        let image = scratch.path + "/data.img"
        #expect(try run(["/usr/bin/truncate", "-s", "48M", image]).status == 0)
        #expect(try run(["/sbin/mkfs.ext4", "-q", "-m", "0", image]).status == 0)
        try FileManager.default.createDirectory(atPath: daemon.dataDirectory, withIntermediateDirectories: true)
        let mount = try run(["/bin/mount", "-o", "loop", image, daemon.dataDirectory])
        try #require(mount.status == 0, "\(mount.stderr)")
        var mounted = true
        defer { if mounted { _ = try? run(["/bin/umount", "-l", daemon.dataDirectory]) } }
        try daemon.start()
        let client = try daemon.connect()
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "ann", on: client, durable: true)
        try Self.execute("CREATE TABLE blobs (b BLOB)", for: "ann", on: client)
        try Self.execute("INSERT INTO notes (title) VALUES ('other')", for: "bob", on: client)

        // Another file takes every free block.
        let filler = daemon.dataDirectory + "/filler"
        _ = try run(["/bin/dd", "if=/dev/zero", "of=" + filler, "bs=1M"])
        for attempt in 0..<3 {
            #expect(ReplicationTests.isError("io.userstore.Store.StorageFailure") {
                try Self.execute("INSERT INTO blobs VALUES (randomblob(4000000))", for: "ann", on: client, durable: attempt == 1)
            }, "a write on a full disk was not refused as StorageFailure")
        }
        #expect(try LogEngineTests.titles("ann", client) == ["before"])
        #expect(try LogEngineTests.titles("bob", client) == ["other"])
        #expect(try client.call("io.userstore.Admin.Status")["replication"] != nil, "the daemon stopped answering")

        // Space back: everything goes through again.
        unlink(filler)
        try Self.execute("INSERT INTO blobs VALUES (randomblob(4000000))", for: "ann", on: client)
        try Self.execute("INSERT INTO notes (title) VALUES ('after the disk filled')", for: "ann", on: client, durable: true)
        try Self.execute("INSERT INTO notes (title) VALUES ('other again')", for: "bob", on: client, durable: true)
        let live = try Self.contents(try Self.storePath("ann", daemon))
        #expect(live.contains("after the disk filled"))

        // The disk lost: a new one, restored from the replica.
        daemon.stop(signal: SIGKILL)
        _ = try run(["/bin/umount", daemon.dataDirectory])
        mounted = false
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let again = try daemon.connect()
        #expect(try again.call("io.userstore.Store.Open", ["user": "ann"])["created"] == false)
        Self.expectSame(try Self.contents(try Self.storePath("ann", daemon)), live)
        #expect(try LogEngineTests.titles("bob", again) == ["other", "other again"])
        daemon.stop()
    }

    /// `durableTimeoutMilliseconds` bounds a durable write from end to end: with replication
    /// stalled (Litestream paused; the log's folder made unwritable), the call returns
    /// ReplicationUnavailable after the time-out, within 10 %.
    @Test func theDurableTimeOutBoundsTheWholeCall() throws {
        let (replica, daemon, client) = try ReplicationTests.started(extra: "  durableTimeoutMilliseconds: 2000")
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "jo", on: client, durable: true)
        let resume = try ReplicationTests.stall(client, replica: replica.path)
        defer { resume() }
        let started = ContinuousClock.now
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            try Self.execute("INSERT INTO notes (title) VALUES ('durable')", for: "jo", on: client, durable: true)
        })
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(2000) && waited <= .milliseconds(2200), "a durable write waited \(waited) against a 2 s time-out")
        resume()
        daemon.stop()
    }

    /// Litestream never outlives its daemon: SIGKILL of the daemon alone ends it within a second
    /// (it runs tied to the daemon, PR_SET_PDEATHSIG), and it runs in the daemon's process group.
    @Test(.litestreamBehaviour) func litestreamEndsWithItsDaemon() throws {
        let (_, daemon, client) = try ReplicationTests.started()
        let litestream = try ReplicationTests.litestreamPID(client)
        #expect(litestream > 0)
        #expect(getpgid(litestream) == getpgid(daemon.pid))
        kill(daemon.pid, SIGKILL)
        daemon.waitForExit()
        #expect(us_wait_for_exit(litestream, 1000) == 1, "Litestream (pid \(litestream)) outlived its daemon by more than a second")
    }
}
