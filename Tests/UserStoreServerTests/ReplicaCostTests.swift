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
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '\(log)'\nexec '\(ReplicationTests.litestream)' \"$@\"\n"
            .write(toFile: binary, atomically: true, encoding: .utf8)
        chmod(binary, 0o755)
        return (binary, log)
    }

    static func subcommands(_ log: String) -> [String] {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// New users are looked up in the replica without a `litestream restore` each; a user the
    /// replica holds and this host lost is still brought back (by one).
    @Test func aNewUserCostsNoLitestreamProcess() throws {
        let replica = try TemporaryDirectory(), tools = try TemporaryDirectory()
        let (litestream, log) = try Self.recordingLitestream(in: tools)
        let config = "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestream)\n"
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
    @Test func concurrentDurableWritesShareSyncs() throws {
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
        #expect(try ReplicationTests.sqlite3(copy, "SELECT count(*) FROM notes") == String(1 + writers * rounds))
    }
}
