import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// A replica that vanishes never turns a lost user into a new, empty store (docs/replication.md,
/// "The replica's identity"): the replica's marker against the data directory's binding, with a
/// `file://` folder replaced by an empty one or by a file, an S3 prefix emptied, a daemon
/// started on an unmounted replica, another replica's marker, and `replication init`.
@Suite(.serialized) struct ReplicaIdentityTests {
    static let durableRows = ["one", "two", "three"]

    /// A host writes durable rows for ann and is lost with its disk; the next host starts on
    /// the same replica and serves bob. Returns the next host and a connection to it.
    static func loseTheFirstHost(_ daemon: DaemonHarness) throws -> VarlinkConnection {
        try daemon.start()
        let first = try daemon.connect()
        for row in durableRows { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(row)')", for: "ann", on: first, durable: true) }
        kill(daemon.pid, SIGKILL)
        daemon.waitForExit()
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let client = try daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('bob')", for: "bob", on: client)
        return client
    }

    /// The lost user is refused while the replica is gone, nothing of her is created, the open
    /// user bob is served (when `bobServed`: a daemon that started without its replica holds no
    /// writer lease and serves no store); once the replica is back she is restored with every
    /// durable row.
    static func expectRefusedThenRestored(_ daemon: DaemonHarness, _ client: VarlinkConnection, bobServed: Bool = true, bringBack: () throws -> Void,
                                          sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            try client.call("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT title FROM notes"])
        }, "the lost user was served while the replica was gone", sourceLocation: sourceLocation)
        #expect(try DurabilityTests.storePath("ann", daemon).isEmpty, "a store was created for the lost user", sourceLocation: sourceLocation)
        if bobServed {
            #expect(try client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT title FROM notes"])["rows"] == [["bob"]],
                    sourceLocation: sourceLocation)
        }
        #expect(try DurabilityTests.waitForReplication(client) { $0["identity"] == "missing" }, sourceLocation: sourceLocation)

        try bringBack()
        #expect(try DurabilityTests.waitForReplication(client) { $0["identity"] == "verified" && $0["lease"]?["state"] == "holding" },
                sourceLocation: sourceLocation)
        let opened = try client.call("io.userstore.Store.Open", ["user": "ann"])
        #expect(opened["created"] == false, "the lost user was created anew", sourceLocation: sourceLocation)
        let rows = try client.call("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT title FROM notes ORDER BY id"])["rows"]
        #expect(rows == .array(durableRows.map { [.string($0)] }), sourceLocation: sourceLocation)
    }

    /// The replica's folder replaced, after the next host started, by an empty folder (what an
    /// unmounted replica's mount point looks like) or by a file.
    @Test(arguments: ["an empty folder", "a file"])
    func aFolderReplicaThatVanishesNeverMakesALostUserNew(replacement: String) throws {
        let replica = try TemporaryDirectory()
        let daemon = try ReplicationTests.daemon(replica: replica.path)
        defer { daemon.stop() }
        let client = try Self.loseTheFirstHost(daemon)
        let away = replica.path + ".away"
        try FileManager.default.moveItem(atPath: replica.path, toPath: away)
        defer { try? FileManager.default.removeItem(atPath: away) }
        if replacement == "a file" {
            #expect(FileManager.default.createFile(atPath: replica.path, contents: Data("not a replica".utf8)))
        } else {
            try FileManager.default.createDirectory(atPath: replica.path, withIntermediateDirectories: false)
        }
        try Self.expectRefusedThenRestored(daemon, client) {
            try FileManager.default.removeItem(atPath: replica.path)
            try FileManager.default.moveItem(atPath: away, toPath: replica.path)
        }
    }

    /// Every object under the S3 prefix moved away (a lifecycle rule, an operator's mistake)
    /// after the next host started, then moved back (boto3).
    @Test func anEmptiedBucketPrefixNeverMakesALostUserNew() throws {
        let server = try SeaweedFS()
        let daemon = try ObjectStoreTests.daemon(server, bucket: "gone")
        defer { daemon.stop() }
        let client = try Self.loseTheFirstHost(daemon)
        let moved = try server.probe(["move", "gone", "users/", "away/"])
        #expect(moved.status == 0 && (Int(moved.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) > 2, "\(moved.output)")
        #expect(try server.keys("gone", prefix: "users/").isEmpty)
        try Self.expectRefusedThenRestored(daemon, client) {
            let back = try server.probe(["move", "gone", "away/", "users/"])
            #expect(back.status == 0, "\(back.output)")
        }
    }

    /// The daemon started while its replica is unmounted (an empty folder where it was) and a
    /// user's store is gone from the disk: it starts, reports the replica missing, and neither
    /// creates the returning user nor any new one; once the replica is back, she is restored.
    @Test func aDaemonStartedOnAnUnmountedReplicaCreatesNoUser() throws {
        let replica = try TemporaryDirectory()
        let daemon = try ReplicationTests.daemon(replica: replica.path)
        defer { daemon.stop() }
        try daemon.start()
        let first = try daemon.connect()
        for row in Self.durableRows { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(row)')", for: "ann", on: first, durable: true) }
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('bob')", for: "bob", on: first, durable: true)
        #expect(daemon.stop() == 0)
        // ann's store is lost from this disk; the replica is unmounted.
        let annPath = try DurabilityTests.storePath("ann", daemon)
        for suffix in ["", "-wal", "-shm"] { unlink(annPath + suffix) }
        let away = replica.path + ".away"
        try FileManager.default.moveItem(atPath: replica.path, toPath: away)
        defer { try? FileManager.default.removeItem(atPath: away) }
        try FileManager.default.createDirectory(atPath: replica.path, withIntermediateDirectories: false)

        try daemon.start()
        let client = try daemon.connect()
        let status = try client.call("io.userstore.Admin.Status")["replication"]
        #expect(status?["identity"] == "missing" && status?["replicaProblem"]?.stringValue?.hasPrefix("ReplicaMissing") == true, "\(String(describing: status))")
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") { try client.call("io.userstore.Store.Open", ["user": "carl"]) })
        #expect(try DurabilityTests.storePath("carl", daemon).isEmpty)
        try Self.expectRefusedThenRestored(daemon, client, bobServed: false) {
            try FileManager.default.removeItem(atPath: replica.path)
            try FileManager.default.moveItem(atPath: away, toPath: replica.path)
        }
    }

    /// A replica whose marker names another replica than the one the data directory replicates
    /// to stops the daemon at start (exit 78, ReplicaMismatch); nothing under it is touched.
    @Test func anotherReplicasMarkerIsRefusedAtStart() throws {
        let mine = try TemporaryDirectory(), theirs = try TemporaryDirectory()
        let other = try ReplicationTests.daemon(replica: theirs.path)
        try other.start()
        _ = try other.connect().call("io.userstore.Store.Open", ["user": "zed"])
        #expect(other.stop() == 0)

        let daemon = try ReplicationTests.daemon(replica: mine.path)
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Open", ["user": "ann"])
        #expect(daemon.stop() == 0)
        let before = FileManager.default.subpaths(atPath: theirs.path)?.sorted()
        try daemon.writeConfig(extra: "replication:\n  replica: \"file://\(theirs.path)\"\n  litestream: \(litestreamPath)\n")
        try daemon.start(waitForReady: false)
        #expect(daemon.waitForExit() == 78)
        #expect(daemon.stderr.contains("ReplicaMismatch"), "\(daemon.stderr)")
        #expect(FileManager.default.subpaths(atPath: theirs.path)?.sorted() == before, "the other replica was written to")
    }

    /// Replication turned on for a data directory that already holds stores, with an empty
    /// replica: refused (it looks like an unmounted one) until `userstorectl replication init`
    /// says it is new; then the stores replicate to it and new users are created.
    @Test func replicationInitMakesANewReplicaUsable() throws {
        let replica = try TemporaryDirectory()
        let daemon = try DaemonHarness()
        try daemon.start()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('local')", for: "ann", on: try daemon.connect())
        #expect(daemon.stop() == 0)
        try daemon.writeConfig(extra: "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestreamPath)\n")
        try daemon.start()
        defer { daemon.stop() }
        let client = try daemon.connect()
        #expect(try client.call("io.userstore.Admin.Status")["replication"]?["identity"] == "missing")
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") { try client.call("io.userstore.Store.Open", ["user": "new"]) })

        let initialised = try run([userstorectlPath, "--socket", daemon.socketPath, "replication", "init", "--json"])
        #expect(initialised.status == 0, "\(initialised.stdout)\(initialised.stderr)")
        let marker = try JSONParser().parse(String(contentsOfFile: replica.path + "/userstore-replica.json", encoding: .utf8))
        #expect(marker["id"] != nil && initialised.stdout.contains(marker["id"]?.stringValue ?? "-"))
        #expect(try client.call("io.userstore.Admin.Status")["replication"]?["identity"] == "verified")
        #expect(try client.call("io.userstore.Store.Open", ["user": "new"])["created"] == true)
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable')", for: "ann", on: client, durable: true)
        // A second init of the same replica changes nothing; another daemon's replica is refused.
        #expect(try run([userstorectlPath, "--socket", daemon.socketPath, "replication", "init"]).status == 0)
        #expect(try JSONParser().parse(String(contentsOfFile: replica.path + "/userstore-replica.json", encoding: .utf8)) == marker)
        let restored = try DurabilityTests.loseHostAndRestore("ann", daemon, client)
        #expect(restored.contains("'local'") && restored.contains("'durable'"))
    }

    /// A replica made before markers existed (Litestream's files directly under each user's
    /// folder, no marker, no lease) is adopted by a new host: the marker is written, and a lost
    /// user comes back from the old layout.
    @Test func aReplicaFromBeforeMarkersIsAdoptedAndRestoresFromItsOldLayout() throws {
        let replica = try TemporaryDirectory()
        let daemon = try ReplicationTests.daemon(replica: replica.path)
        defer { daemon.stop() }
        // The layout before markers: <ab>/<cd>/ann/ltx/…, nothing at the root.
        try LitestreamCopies.write("ann", titles: Self.durableRows, replica: "file://" + replica.path, folder: try LitestreamCopies.folder(of: "ann", epoch: nil))
        #expect(!FileManager.default.fileExists(atPath: replica.path + "/userstore-replica.json"))

        try daemon.start()
        let client = try daemon.connect()
        let marker = try JSONParser().parse(String(contentsOfFile: replica.path + "/userstore-replica.json", encoding: .utf8))
        #expect(marker["adopted"] == true)
        #expect(try client.call("io.userstore.Store.Open", ["user": "ann"])["created"] == false)
        #expect(try client.call("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT title FROM notes ORDER BY id"])["rows"]
                == .array(Self.durableRows.map { [.string($0)] }))
    }
}
