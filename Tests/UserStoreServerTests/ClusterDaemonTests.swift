import DaemonTestSupport
import ClusterTestSupport
import Foundation
import Testing
import UserStoreCluster
import UserStoreCore
import UserStoreReplication
import Varlink

/// Two real daemons and one real etcd member (`cluster.*`, docs/cluster.md): each serves the
/// users of its buckets and answers WrongHost, naming the owner, for the others; when one
/// leaves, the other takes its buckets.
@Suite(.serialized) struct ClusterDaemonTests {
    /// The only thing the test's hosts share besides etcd: a bucket on an S3 API of the test's
    /// own (SeaweedFS).
    static func objectStore() throws -> SeaweedFS {
        let server = try SeaweedFS()
        try server.createBucket("cluster")
        return server
    }

    /// Which epochs hold `user`'s copy in `server`: the epochs of the user's records in the log
    /// and its folded objects.
    static func epochs(of user: String, in server: SeaweedFS) throws -> [Int64] {
        Set(try logRecords(of: user, in: server).map(\.epoch)).sorted()
    }

    /// Every record of `user` in the log's objects and folded objects of `server` (read with boto3).
    /// An object listed and gone by the time it is read was folded meanwhile, into a fold the
    /// listing may not hold: the reading starts over (found by CI: b's record was missed so).
    static func logRecords(of user: String, in server: SeaweedFS) throws -> [LogRecord] {
        let folder = try TemporaryDirectory()
        for _ in 0..<10 {
            var records: [LogRecord] = []
            var whole = true
            for key in try server.keys("cluster", prefix: "users/") where key.hasSuffix(".usl") {
                let file = folder.path + "/object"
                unlink(file)
                let result = try server.probe(["get", "cluster", key, file])
                if result.output.contains("NoSuchKey") {
                    whole = false
                    break
                }
                #expect(result.status == 0, "\(result.output)")
                records += try LogSegment.decode([UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))).records.filter { $0.user == user }
            }
            if whole { return records }
        }
        Issue.record("the bucket's log kept changing under ten readings")
        return []
    }

    /// A daemon of the cluster `host` on `port`; `extraConfig`: more YAML (a rollout policy, say).
    static func daemon(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS, extraConfig: String = "") throws -> DaemonHarness {
        let daemon = try DaemonHarness(extraConfig: configuration(host, port: port, etcd: etcd, store: store, extraConfig: extraConfig))
        daemon.environment = store.environment
        return daemon
    }

    /// The YAML of ``daemon(_:port:etcd:store:extraConfig:)``: the replica reached at `endpoint`
    /// (a proxy) if given, on `engine`, with `replication` (more lines of that section, indented).
    static func configuration(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS, endpoint: String? = nil,
                              replication: String = "", extraConfig: String = "") -> String {
        """
            replication:
              replica: "\(store.replicaURL(bucket: "cluster", prefix: "users", endpoint: endpoint))"
              litestream: \(litestreamPath)
            \(replication)
            cluster:
              host: \(host)
              etcd: [\(etcd.endpoints.joined(separator: ", "))]
              address: 127.0.0.1:\(port)
              leaseSeconds: 3
              forward: false
            \(extraConfig)
            """
    }

    /// Who serves `user` according to `daemon`: "here", the owner WrongHost names (with its
    /// address and epoch), or the error's name.
    static func answer(_ connection: VarlinkConnection, _ user: String) -> (String, String, Int64) {
        do {
            _ = try connection.call("io.userstore.Store.Open", ["user": .string(user)])
            return ("here", "", 0)
        } catch let error as VarlinkError where error.name == "io.userstore.Store.WrongHost" {
            #expect(error.parameters["user"]?.stringValue == user)
            return (error.parameters["host"]?.stringValue ?? "?", error.parameters["address"]?.stringValue ?? "?", error.parameters["epoch"]?.integerValue ?? 0)
        } catch let error as VarlinkError {
            return (error.name, "", 0)
        } catch {
            return ("\(error)", "", 0)
        }
    }

    /// Polls (up to 30 s) until `condition` holds; each look is a round of calls to the daemons.
    static func eventually(_ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if try condition() { return true }
        }
        return false
    }

    /// a alone takes every bucket; b, joining later, names a as the owner of every user (buckets
    /// move only when a host leaves or an operator moves them); a leaves and b takes them all.
    @Test func aDaemonServesItsBucketsNamesTheOwnerOfOthersAndTakesOverWhenItLeaves() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try Self.objectStore()
        let a = try Self.daemon("a", port: 7101, etcd: etcd, store: store), b = try Self.daemon("b", port: 7102, etcd: etcd, store: store)
        try a.start()
        let toA = try a.connect()
        let users = (0..<40).map { "user-\($0)" }
        #expect(Self.eventually { users.allSatisfy { Self.answer(toA, $0).0 == "here" } }, "\(a.stderr.suffix(3000))")
        _ = try toA.call("io.userstore.Store.Execute", ["user": "user-0", "sql": "INSERT INTO notes (title) VALUES ('on a')"])

        try b.start()
        let toB = try b.connect()
        #expect(Self.eventually { users.allSatisfy { Self.answer(toB, $0).0 == "a" } }, "\(b.stderr.suffix(3000))")
        let (host, address, epoch) = Self.answer(toB, "user-0")
        #expect(host == "a" && address == "127.0.0.1:7101" && epoch > 0)
        // What an operator sees from b: a owns every bucket and is the controller.
        let status = try run([userstorectlPath, "cluster", "status"], environment: ["USERSTORE_SOCKET": b.socketPath])
        #expect(status.status == 0, "\(status)")
        let lines = status.stdout.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ") }
        #expect(lines.contains { $0.hasPrefix("host b acknowledging") && $0.contains("controller a") && $0.contains("unassigned buckets 0") }, "\(status.stdout)")
        #expect(lines.contains { $0.hasPrefix("a 127.0.0.1:7101 yes no 4096 ") }, "\(status.stdout)")
        #expect(lines.contains("b 127.0.0.1:7102 yes no 0 0"), "\(status.stdout)")
        #expect(try run(["/usr/bin/find", a.dataDirectory, "-name", "user-0.sqlite"]).stdout.contains("user-0"))
        #expect(try run(["/usr/bin/find", b.dataDirectory, "-name", "user-0.sqlite"]).stdout.isEmpty)

        // a leaves (SIGTERM: it revokes its lease); b's controller gives b every bucket, each
        // at a new epoch.
        let left = ContinuousClock.now
        #expect(a.stop() == 0)
        #expect(Self.eventually { users.allSatisfy { Self.answer(toB, $0).0 == "here" } }, "\(b.stderr.suffix(3000))")
        print("cluster: b served all of a's users \(ContinuousClock.now - left) after a was told to stop")
        // What a acknowledged came to b through the replica (a's final sync, then b's restore).
        #expect(try toB.call("io.userstore.Store.Query", ["user": "user-0", "sql": "SELECT title FROM notes"])["rows"] == [["on a"]])
        #expect(b.stderr.contains("event=store-restored"))
        // Each owner replicated under its own epoch: a's folder, then b's (newer) once b wrote.
        _ = try toB.call("io.userstore.Store.Execute", ["user": "user-0", "sql": "INSERT INTO notes (title) VALUES ('on b')", "durable": true])
        let epochs = try Self.epochs(of: "user-0", in: store)
        #expect(epochs.count == 2 && epochs[0] < epochs[1] && epochs[0] <= epoch, "\(epochs), a's epoch \(epoch)")
        #expect(a.stderr.contains("event=cluster-joined") && a.stderr.contains("event=cluster-left"))
        #expect(b.stderr.contains("event=cluster-controller"))
        #expect(b.stop() == 0)

        // a comes back and owns everything again: its own copy of user-0 is older than b's
        // (epoch), so it is set aside and b's copy restored, with b's write in it.
        try a.start()
        let again = try a.connect()
        #expect(Self.eventually { users.allSatisfy { Self.answer(again, $0).0 == "here" } }, "\(a.stderr.suffix(3000))")
        #expect(try again.call("io.userstore.Store.Query", ["user": "user-0", "sql": "SELECT title FROM notes ORDER BY id"])["rows"] == [["on a"], ["on b"]])
        #expect(a.stderr.contains("event=store-superseded"))
        #expect(try run(["/usr/bin/find", a.dataDirectory, "-name", "user-0.sqlite.superseded-e*"]).stdout.contains("superseded"))
        // A store only a has ever had is not set aside when a opens it again.
        _ = try again.call("io.userstore.Store.Execute", ["user": "only-a", "sql": "INSERT INTO notes (title) VALUES ('x')"])
        #expect(a.stop() == 0)
        try a.start()
        let third = try a.connect()
        #expect(Self.eventually { Self.answer(third, "only-a").0 == "here" })
        #expect(try third.call("io.userstore.Store.Query", ["user": "only-a", "sql": "SELECT title FROM notes"])["rows"] == [["x"]])
        #expect(try run(["/usr/bin/find", a.dataDirectory, "-name", "only-a.sqlite.superseded-e*"]).stdout.isEmpty)
        #expect(a.stop() == 0)
    }

    /// A durable write is acknowledged only if etcd, read after the replica confirmed it, still
    /// names this host the owner at the epoch it replicates under.
    @Test func aDurableWriteIsNotAcknowledgedOnceTheBucketsEpochMoved() async throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try Self.objectStore()
        let a = try Self.daemon("a", port: 7103, etcd: etcd, store: store)
        try a.start()
        let client = try a.connect()
        #expect(Self.eventually { Self.answer(client, "dora").0 == "here" })
        _ = try client.call("io.userstore.Store.Execute", ["user": "dora", "sql": "INSERT INTO notes (title) VALUES ('one')", "durable": true])
        // The bucket's record written again as it is: same owner, new epoch (as a move and a
        // move back would leave it). The store still replicates under the old epoch.
        let key = BucketRecord.key(of: Placement.bucket(for: try UserID("dora")))
        let client2 = EtcdClient(endpoints: etcd.endpoints)
        let record = try #require(try await client2.get(key))
        try await client2.put(key, record.text)
        do {
            _ = try client.call("io.userstore.Store.Execute", ["user": "dora", "sql": "INSERT INTO notes (title) VALUES ('two')", "durable": true])
            Issue.record("a durable write was acknowledged under a superseded epoch")
        } catch let error as VarlinkError {
            #expect(error.name == "io.userstore.Store.ClusterUnavailable" && (error.parameters["message"]?.stringValue ?? "").contains("epoch"), "\(error)")
        }
        // Committed here all the same (as a durable write the replica cannot confirm).
        #expect(try client.call("io.userstore.Store.Query", ["user": "dora", "sql": "SELECT count(*) AS n FROM notes"])["rows"] == [[2]])
        // The bucket is still a's, at the newer epoch: the store is closed and opens again under
        // it, and durable writes are acknowledged again, naming that epoch.
        let current = try #require(try await client2.get(key)).modRevision
        #expect(ClusterDaemonTests.eventually {
            let reply = try? client.call("io.userstore.Store.Execute", ["user": "dora", "sql": "INSERT INTO notes (title) VALUES ('three')", "durable": true])
            return reply?["epoch"] == .integer(current) && reply?["host"] == "a"
        }, "\(a.stderr.suffix(2000))")
        #expect(a.stop() == 0)
    }

    /// A planned move under an open transaction: the bucket's users get Retry while its owner
    /// waits for the transaction; the committed transaction reaches the new owner; then a
    /// drain moves everything else.
    @Test func aMoveWaitsForItsStoresAndLosesNothingAndADrainEmptiesAHost() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try Self.objectStore()
        let a = try Self.daemon("a", port: 7105, etcd: etcd, store: store), b = try Self.daemon("b", port: 7106, etcd: etcd, store: store)
        try a.start()
        let toA = try a.connect()
        let users = (0..<20).map { "mover-\($0)" }
        #expect(Self.eventually { users.allSatisfy { Self.answer(toA, $0).0 == "here" } })
        try b.start()
        let toB = try b.connect()
        #expect(Self.eventually { users.allSatisfy { Self.answer(toB, $0).0 == "a" } })
        for user in users { _ = try toA.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title) VALUES ('before')"]) }

        // A transaction open on a for mover-0 while its bucket is moved to b.
        let transaction = try toA.call("io.userstore.Store.Begin", ["user": "mover-0"])["transaction"]!
        _ = try toA.call("io.userstore.Store.Execute", ["transaction": transaction, "sql": "INSERT INTO notes (title) VALUES ('in the transaction')"])
        let bucket = Placement.bucket(for: try UserID("mover-0"))
        let move = try run([userstorectlPath, "cluster", "move", "\(bucket)", "b"], environment: ["USERSTORE_SOCKET": b.socketPath])
        #expect(move.status == 0 && move.stdout.contains("moving bucket \(bucket) from a to b"), "\(move)")
        // Once a sees the bucket draining (before that, a request would queue behind the
        // transaction), its requests get Retry at once.
        let other = try a.connect()
        #expect(try Self.eventually { try other.call("io.userstore.Admin.Cluster")["movingBuckets"] == 1 })
        #expect(Self.answer(other, "mover-0").0 == "io.userstore.Store.Retry")
        _ = try toA.call("io.userstore.Store.Commit", ["transaction": transaction])
        #expect(Self.eventually { Self.answer(toB, "mover-0").0 == "here" }, "\(b.stderr.suffix(2000))")
        #expect(try toB.call("io.userstore.Store.Query", ["user": "mover-0", "sql": "SELECT title FROM notes ORDER BY id"])["rows"] == [["before"], ["in the transaction"]])
        #expect(Self.answer(other, "mover-0").0 == "b")
        #expect(a.stderr.contains("event=cluster-bucket-released"))

        // Drain a: every bucket goes to b, with every user's rows.
        let drain = try run([userstorectlPath, "cluster", "drain", "a"], environment: ["USERSTORE_SOCKET": a.socketPath])
        #expect(drain.status == 0 && drain.stdout.contains("draining a:"), "\(drain)")
        let drained = ContinuousClock.now
        #expect(Self.eventually { users.allSatisfy { Self.answer(other, $0).0 == "b" } }, "\(a.stderr.suffix(2000))")
        print("cluster: draining a (4095 buckets, \(users.count) users) took \(ContinuousClock.now - drained)")
        for user in users.dropFirst() {
            #expect(try toB.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT title FROM notes"])["rows"] == [["before"]])
        }
        let status = try run([userstorectlPath, "cluster", "status"], environment: ["USERSTORE_SOCKET": a.socketPath])
        let lines = status.stdout.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ") }
        #expect(lines.contains { $0.hasPrefix("a 127.0.0.1:7105 yes yes 0 ") } && lines.contains { $0.hasPrefix("b 127.0.0.1:7106 yes no 4096 ") }, "\(status.stdout)")
        #expect(a.stop() == 0)
        #expect(b.stop() == 0)
    }

    @Test func clusterStatusOnOneHostSaysClusterOff() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let status = try run([userstorectlPath, "cluster", "status"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(status.status != 0 && status.stderr.contains("ClusterOff"), "\(status)")
        daemon.stop()
    }

    @Test func aClusterWithoutForwardFalseOrAHostIsRefusedNamingTheKey() throws {
        for (config, key) in [
            ("replication:\n  replica: file:///tmp/r\ncluster:\n  host: a\n  etcd: [http://127.0.0.1:2379]\n  address: 127.0.0.1:7001", "cluster.forward"),
            ("cluster:\n  host: a\n  etcd: [http://127.0.0.1:2379]\n  address: 127.0.0.1:7001\n  forward: false", "replication.replica"),
            ("cluster:\n  etcd: [http://127.0.0.1:2379]", "cluster.host"),
            ("cluster:\n  host: a\n  address: 127.0.0.1:7001\n  forward: false", "cluster.etcd"),
            ("cluster:\n  host: a/b\n  etcd: [http://127.0.0.1:2379]\n  address: 127.0.0.1:7001\n  forward: false", "cluster.host"),
            ("cluster:\n  host: a\n  etcd: [http://127.0.0.1:2379]\n  forward: false", "cluster.address"),
        ] {
            let daemon = try DaemonHarness(extraConfig: config)
            try daemon.start(waitForReady: false)
            #expect(daemon.waitForExit() != 0)
            #expect(daemon.stderr.contains(key), "\(config): \(daemon.stderr)")
        }
    }
}
