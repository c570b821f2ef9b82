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

    /// Loses the host (the daemon SIGKILLed, the data directory deleted), starts a new
    /// daemon on the same replica and returns what `user`'s store holds once its first request
    /// restored it.
    static func loseHostAndRestore(_ user: String, _ daemon: DaemonHarness, _ client: VarlinkConnection) throws -> String {
        daemon.stop(signal: SIGKILL)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let opened = try daemon.connect().call("io.userstore.Store.Open", ["user": .string(user)])
        #expect(opened["created"] == false, "\(user) was created empty instead of restored")
        // Read once the daemon is gone: it holds each open store's file exclusively.
        let path = try storePath(user, daemon)
        daemon.stop()
        return try contents(path)
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
        // The host is lost right after the acknowledgement; what the store held then is read
        // from its disk once the daemon (which holds the file exclusively) is gone.
        daemon.stop(signal: SIGKILL)
        let live = try contents(try storePath(user, daemon))
        #expect(live.contains("CREATE TABLE blobs"), sourceLocation: sourceLocation)
        expectSame(try loseHostAndRestore(user, daemon, client), live, sourceLocation)
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
        // The disk lost: a new one, restored from the replica (what the store held is read once
        // the daemon, which holds the file exclusively, is gone).
        daemon.stop(signal: SIGKILL)
        let live = try Self.contents(try Self.storePath("ann", daemon))
        #expect(live.contains("after the disk filled"))
        _ = try run(["/bin/umount", daemon.dataDirectory])
        mounted = false
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let again = try daemon.connect()
        #expect(try again.call("io.userstore.Store.Open", ["user": "ann"])["created"] == false)
        #expect(try LogEngineTests.titles("bob", again) == ["other", "other again"])
        daemon.stop()
        Self.expectSame(try Self.contents(try Self.storePath("ann", daemon)), live)
    }

    /// `durableTimeoutMilliseconds` bounds a durable write from end to end: with replication
    /// stalled (Litestream paused; the log's folder made unwritable), the call returns
    /// ReplicationUnavailable after the time-out, within 10 %.
    @Test func theDurableTimeOutBoundsTheWholeCall() throws {
        let (replica, daemon, client) = try ReplicationTests.started(extra: "  durableTimeoutMilliseconds: 2000")
        try Self.execute("INSERT INTO notes (title) VALUES ('before')", for: "jo", on: client, durable: true)
        let resume = try ReplicationTests.stall(replica: replica.path)
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

}
