import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// What replication costs per user and per write (issue #38), through a real Litestream to a
/// `file://` replica: a new user spawns no Litestream process, and concurrent durable writes
/// share syncs instead of each waiting for its own.
@Suite(.serialized) struct ReplicaCostTests {
    /// A `litestream` that writes its subcommand to `log` and then runs the real one: which
    /// processes the daemon started.
    static func recordingLitestream(in directory: TemporaryDirectory) throws -> (binary: String, log: String) {
        let binary = directory.path + "/litestream", log = directory.path + "/subcommands"
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '\(log)'\nexec '\(litestreamPath)' \"$@\"\n"
            .write(toFile: binary, atomically: true, encoding: .utf8)
        chmod(binary, 0o755)
        return (binary, log)
    }

    static func subcommands(_ log: String) -> [String] {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// New users are looked up in the replica without a `litestream restore` each; a user the
    /// replica holds and this host lost is still brought back (by one).
    @Test(.litestreamBehaviour) func aNewUserCostsNoLitestreamProcess() throws {
        let replica = try TemporaryDirectory(), tools = try TemporaryDirectory()
        let (litestream, log) = try Self.recordingLitestream(in: tools)
        let config = "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestream)\n  engine: \(ReplicationTests.engine)\n"
        let first = try DaemonHarness(extraConfig: config)
        try first.start()
        let client = try first.connect()
        for index in 0..<5 {
            #expect(try client.call("io.userstore.Store.Open", ["user": .string("new\(index)")])["created"] == true)
            try ReplicationTests.insert("kept", for: "new\(index)", on: client, durable: true)
        }
        #expect(Self.subcommands(log).filter { $0 == "restore" }.isEmpty, "\(Self.subcommands(log))")
        _ = first.stop()

        // The host's disk is lost: the same users come back from the replica, one restore each.
        let second = try DaemonHarness(extraConfig: config)
        try second.start()
        #expect(try second.connect().call("io.userstore.Store.Query", ["user": "new3", "sql": "SELECT title FROM notes"])["rows"] == [["kept"]])
        #expect(Self.subcommands(log).filter { $0 == "restore" }.count == 1, "\(Self.subcommands(log))")
        _ = second.stop()
    }

    /// Sixteen connections write durably to one store at once: every write is acknowledged and
    /// in the replica, and they shared syncs (group commit) — fewer syncs than writes.
    @Test(.litestreamBehaviour) func concurrentDurableWritesShareSyncs() throws {
        let (replica, daemon, client) = try ReplicationTests.started()
        defer { _ = daemon.stop() }
        try ReplicationTests.insert("first", for: "shared", on: client, durable: true)
        let before = try client.call("io.userstore.Admin.Status")["replication"]
        let writers = 16, rounds = 5
        let failures = Mutex<[String]>([])
        let socket = daemon.socketPath
        // A thread per writer (concurrentPerform would run only as many as there are cores).
        let group = DispatchGroup()
        for writer in 0..<writers {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                do {
                    let connection = try VarlinkConnection(path: socket)
                    connection.setReceiveTimeout(seconds: 60)
                    for round in 0..<rounds { try ReplicationTests.insert("w\(writer)r\(round)", for: "shared", on: connection, durable: true) }
                } catch {
                    failures.withLock { $0.append("writer \(writer): \(error)") }
                }
            }
        }
        group.wait()
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        let after = try client.call("io.userstore.Admin.Status")["replication"]
        let syncs = (after?["syncs"]?.integerValue ?? 0) - (before?["syncs"]?.integerValue ?? 0)
        let shared = (after?["sharedSyncWaits"]?.integerValue ?? 0) - (before?["sharedSyncWaits"]?.integerValue ?? 0)
        print("group commit: \(writers * rounds) durable writes from \(writers) connections, \(syncs) syncs, \(shared) waits shared")
        #expect(shared > 0 && syncs < Int64(writers * rounds), "syncs \(syncs), shared \(shared)")
        let scratch = try TemporaryDirectory()
        let copy = try ReplicationTests.replicaCopy(of: "shared", daemon: daemon, replica: replica.path, directory: scratch.path)
        #expect(try sqlite3(copy, "SELECT count(*) FROM notes") == String(1 + writers * rounds))
    }

    /// Bytes of every level-0 LTX file (what a sync ships; compactions write higher levels on
    /// their own schedule) in `user`'s folder of the `file://` replica at `replica`.
    static func shippedBytes(_ user: String, in replica: String) -> Int {
        let files = FileManager.default.enumerator(atPath: replica)?.compactMap { $0 as? String } ?? []
        return files.filter { $0.contains("/\(user)/") && $0.contains("/ltx/0/") && $0.hasSuffix(".ltx") }
            .compactMap { (try? FileManager.default.attributesOfItem(atPath: replica + "/" + $0)[.size]) as? Int }
            .reduce(0, +)
    }

    /// A store closed and reopened unchanged ships what changed, not itself again: it keeps
    /// its WAL at close, so the next registration finds Litestream's position in it and goes on
    /// from there (before, every reopen shipped a snapshot: a 10 MB store, 10 MB). And the
    /// replica built that way still restores to exactly the live store.
    @Test(.litestreamBehaviour) func reopeningAStoreShipsOnlyWhatChanged() throws {
        let (replica, daemon, client) = try ReplicationTests.started(extra: "maxOpenStores: 1")
        defer { _ = daemon.stop() }
        let size = 10 * 1_048_576
        _ = try client.call("io.userstore.Store.Execute", ["user": "ann", "sql": "CREATE TABLE blobs (b BLOB)"])
        _ = try client.call("io.userstore.Store.Execute", ["user": "ann", "sql": .string("INSERT INTO blobs VALUES (randomblob(\(size)))")])
        try ReplicationTests.insert("before", for: "ann", on: client, durable: true)
        #expect(Self.shippedBytes("ann", in: replica.path) > size, "the first registration ships the store")

        // Another user takes the one open slot: ann is synced, let go of and closed.
        try ReplicationTests.insert("other", for: "bob", on: client, durable: true)
        let open = try client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
        #expect(open == ["bob"])
        let closed = Self.shippedBytes("ann", in: replica.path)

        try ReplicationTests.insert("after", for: "ann", on: client, durable: true)
        let reopened = Self.shippedBytes("ann", in: replica.path) - closed
        print("reopening a \(size)-byte store shipped \(reopened) bytes of level-0 LTX files (\(closed) before)")
        #expect(reopened < size / 100, "the reopen shipped \(reopened) bytes of a \(size)-byte store")

        let live = try DurabilityTests.contents(try DurabilityTests.storePath("ann", daemon))
        #expect(live.contains("'after'"))
        DurabilityTests.expectSame(try DurabilityTests.loseHostAndRestore("ann", daemon, client), live)
    }

    /// Closed replicated stores keep their WAL, so their version is not in the file's header
    /// alone: a restarted daemon's fleet index reads it through a read-only connection, without
    /// opening the stores (which would register each with Litestream) and without removing the
    /// WALs (which would make their next reopen ship a snapshot).
    /// (Litestream only: the log engine checkpoints a store whose records are stored as it closes.)
    @Test(.litestreamBehaviour) func aRestartReadsKeptWALsWithoutOpeningTheStores() throws {
        let (_, daemon, client) = try ReplicationTests.started()
        let users = ["kim", "lee", "max"]
        for user in users { try ReplicationTests.insert("kept", for: user, on: client, durable: true) }
        let version = try client.call("io.userstore.Store.Open", ["user": "kim"])["schemaVersion"]
        _ = daemon.stop()
        let wals = try users.map { try DurabilityTests.storePath($0, daemon) + "-wal" }
        let sizes = wals.map { (try? FileManager.default.attributesOfItem(atPath: $0)[.size] as? Int) ?? 0 }
        #expect(sizes.allSatisfy { $0 > 0 }, "each store kept its WAL at close: \(sizes)")

        try daemon.start()
        defer { _ = daemon.stop() }
        let again = try daemon.connect()
        // The scan is the daemon's own start-up work: asked until it says it is complete.
        let deadline = ContinuousClock.now + .seconds(60)
        while try again.call("io.userstore.Admin.Status")["indexComplete"] != true, ContinuousClock.now < deadline {}
        var listed: [String: JSONValue] = [:]
        try again.stream("io.userstore.Admin.ListStores") { reply in
            if let store = reply["store"], let user = store["user"]?.stringValue { listed[user] = store["schemaVersion"] }
        }
        for user in users { #expect(listed[user] == version, "\(user): \(String(describing: listed[user])), expected \(String(describing: version))") }
        #expect(try again.call("io.userstore.Admin.Status")["openStores"] == 0, "the scan opened stores")
        #expect(wals.allSatisfy { ((try? FileManager.default.attributesOfItem(atPath: $0)[.size] as? Int) ?? 0) > 0 }, "the scan removed a WAL")
    }
}
