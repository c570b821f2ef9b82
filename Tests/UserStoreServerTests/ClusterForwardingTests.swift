import DaemonTestSupport
import ClusterTestSupport
import Foundation
import Testing
import UserStoreCluster
import UserStoreCore
import Varlink

/// Forwarding between daemons (`cluster.forward`, docs/cluster.md): a client keeps talking to
/// its local daemon, which sends every `io.userstore.Store` call for a user another host owns
/// to that host over mutual TLS — single calls, pipelined calls, interactive transactions and
/// streamed replies alike. Real etcd, real daemons, certificates made with openssl.
@Suite(.serialized) struct ClusterForwardingTests {
    static func daemon(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS, certificates: ClusterCertificates,
                       timeoutMilliseconds: Int = 30_000) throws -> DaemonHarness {
        let daemon = try DaemonHarness(extraConfig: """
            replication:
              replica: "\(store.replicaURL(bucket: "cluster", prefix: "users"))"
              litestream: \(litestreamPath)
            cluster:
              host: \(host)
              etcd: [\(etcd.endpoints.joined(separator: ", "))]
              address: 127.0.0.1:\(port)
              leaseSeconds: 3
              forwardTimeoutMilliseconds: \(timeoutMilliseconds)
            \(certificates.tls(for: host))
            """)
        daemon.environment = store.environment
        return daemon
    }

    /// The peer probe's outcome against `port` with these files (no certificate: nil).
    static func probe(port: Int, ca: String, certificate: String? = nil, key: String? = nil,
                      method: String = "io.userstore.Store.Open", parameters: String = #"{"user": "probe"}"#) throws -> [String: Any] {
        let arguments = [repositoryRoot + "/Tests/Helpers/peer-probe.py", "127.0.0.1", "\(port)", ca] + [certificate, key].compactMap { $0 }
            + ["--method", method, "--parameters", parameters]
        let result = try run(["/usr/bin/python3"] + arguments)
        return (try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]) ?? ["outcome": "unreadable: \(result)"]
    }

    /// Waits (up to 30 s) until the daemon behind `connection` sees a record for every bucket.
    static func everyBucketAssigned(_ connection: VarlinkConnection) throws -> Bool {
        try ClusterDaemonTests.eventually { try connection.call("io.userstore.Admin.Cluster")["unassignedBuckets"] == 0 }
    }

    /// a owns every bucket (it starts alone); b's clients reach a's users through b.
    @Test func everyKindOfStoreCallGoesToTheOwnerAndBackInOrder() async throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let certificates = try ClusterCertificates(["a": "127.0.0.1", "b": "127.0.0.1"])
        let a = try Self.daemon("a", port: 7111, etcd: etcd, store: store, certificates: certificates)
        let b = try Self.daemon("b", port: 7112, etcd: etcd, store: store, certificates: certificates)
        try a.start()
        let toA = try a.connect()
        #expect(try Self.everyBucketAssigned(toA), "\(a.stderr.suffix(3000))")
        try b.start()
        let toB = try b.connect()
        toB.setReceiveTimeout(seconds: 60)
        // Once b has read the records (until then it answers ClusterUnavailable), a serves
        // every user through it.
        #expect(try Self.everyBucketAssigned(toB), "\(b.stderr.suffix(3000))")

        // A write through b lands in a's store, and only there.
        let inserted = try toB.call("io.userstore.Store.Execute", ["user": "fwd-0", "sql": "INSERT INTO notes (title) VALUES ('through b')"])
        #expect(inserted["changes"] == 1)
        #expect(try run(["/usr/bin/find", a.dataDirectory, "-name", "fwd-0.sqlite"]).stdout.contains("fwd-0"))
        #expect(try run(["/usr/bin/find", b.dataDirectory, "-name", "fwd-0.sqlite"]).stdout.isEmpty)
        #expect(try toA.call("io.userstore.Store.Query", ["user": "fwd-0", "sql": "SELECT title FROM notes"])["rows"] == [["through b"]])

        // A durable write through b names the host that acknowledged it and the epoch.
        let durable = try toB.call("io.userstore.Store.Execute", ["user": "fwd-0", "sql": "INSERT INTO notes (title) VALUES ('durable')", "durable": true])
        let epoch = try #require(durable["epoch"]?.integerValue)
        let record = try await EtcdClient(endpoints: etcd.endpoints).get(BucketRecord.key(of: Placement.bucket(for: try UserID("fwd-0"))))
        #expect(durable["host"] == "a" && epoch == record?.modRevision, "\(durable)")

        // An interactive transaction through b: it lives on a (a's other clients wait for it),
        // and commits there.
        let transaction = try #require(try toB.call("io.userstore.Store.Begin", ["user": "fwd-1"])["transaction"])
        _ = try toB.call("io.userstore.Store.Execute", ["transaction": transaction, "sql": "INSERT INTO notes (title) VALUES ('in tx')"])
        #expect(throws: VarlinkError.self) { _ = try toB.call("io.userstore.Store.Query", ["user": "fwd-1", "sql": "SELECT 1"]) } // TransactionInProgress, from a
        _ = try toB.call("io.userstore.Store.Commit", ["transaction": transaction])
        #expect(try toA.call("io.userstore.Store.Query", ["user": "fwd-1", "sql": "SELECT title FROM notes"])["rows"] == [["in tx"]])
        // One rolled back through b leaves nothing; the id is gone afterwards.
        let second = try #require(try toB.call("io.userstore.Store.Begin", ["user": "fwd-1"])["transaction"])
        _ = try toB.call("io.userstore.Store.Execute", ["transaction": second, "sql": "INSERT INTO notes (title) VALUES ('rolled back')"])
        _ = try toB.call("io.userstore.Store.Rollback", ["transaction": second])
        #expect(try toA.call("io.userstore.Store.Query", ["user": "fwd-1", "sql": "SELECT count(*) FROM notes"])["rows"] == [[1]])
        do {
            _ = try toB.call("io.userstore.Store.Commit", ["transaction": second])
            Issue.record("a rolled back transaction committed")
        } catch let error as VarlinkError {
            #expect(error.name == "io.userstore.Store.NoSuchTransaction", "\(error)")
        }

        // A streamed query through b: 3,000 rows in several parts, in order.
        _ = try toB.call("io.userstore.Store.Batch", ["user": "fwd-2", "statements": .array((0..<3000).map {
            .object(["sql": "INSERT INTO notes (title) VALUES (?)", "parameters": .array([.string("row \($0)")])])
        })])
        var rows: [JSONValue] = [], parts = 0
        try toB.stream("io.userstore.Store.Query", ["user": "fwd-2", "sql": "SELECT title FROM notes ORDER BY id"]) { reply in
            parts += 1
            rows += reply["rows"]?.arrayValue ?? []
        }
        #expect(rows.count == 3000 && parts > 1 && rows.first == ["row 0"] && rows.last == ["row 2999"], "\(rows.count) rows in \(parts) parts")

        // Pipelined calls for users of a and an error among them: replies in request order.
        for index in 0..<200 {
            let sql = index == 100 ? "SELECT * FROM no_such_table" : "SELECT \(index)"
            try toB.send(VarlinkCall(method: "io.userstore.Store.Query", parameters: ["user": .string("fwd-\(index % 9)"), "sql": .string(sql)]))
        }
        for index in 0..<200 {
            let reply = try toB.readReply()
            if index == 100 {
                #expect(reply.error == "io.userstore.Store.SQLError", "\(reply)")
            } else {
                #expect(reply.parameters["rows"] == [[.integer(Int64(index))]], "reply \(index): \(reply)")
            }
        }
        // Oneway calls: one lands on a with no reply; one the owner answers anyway (a
        // transaction's call may not be oneway) costs the calls behind it nothing.
        try toB.send(VarlinkCall(method: "io.userstore.Store.Execute", parameters: ["user": "fwd-3", "sql": "INSERT INTO notes (title) VALUES ('oneway')"], oneway: true))
        let open = try #require(try toB.call("io.userstore.Store.Begin", ["user": "fwd-4"])["transaction"])
        try toB.send(VarlinkCall(method: "io.userstore.Store.Execute", parameters: ["transaction": open, "sql": "SELECT 1"], oneway: true))
        #expect(try toB.call("io.userstore.Store.Query", ["user": "fwd-3", "sql": "SELECT 'first'"])["rows"] == [["first"]])
        #expect(try toB.call("io.userstore.Store.Query", ["user": "fwd-3", "sql": "SELECT title FROM notes"])["rows"] == [["oneway"]])
        _ = try toB.call("io.userstore.Store.Rollback", ["transaction": open])

        // A watch through b: put in place on a, and a change made on a comes back through b.
        let watcher = try b.connect()
        watcher.setReceiveTimeout(seconds: 60)
        try watcher.send(VarlinkCall(method: "io.userstore.Store.Watch", parameters: ["user": "fwd-5"], more: true))
        let ready = try watcher.readReply().checked()
        #expect(ready.parameters["ready"] == true && ready.continues, "\(ready)")
        let start = try #require(ready.parameters["position"]?.integerValue)
        _ = try toA.call("io.userstore.Store.Execute", ["user": "fwd-5", "sql": "INSERT INTO notes (title) VALUES ('watched')"])
        let change = try watcher.readReply().checked()
        #expect(change.parameters["position"]?.integerValue == start + 1 && change.continues, "\(change)")
        #expect(change.parameters["changes"]?.arrayValue?.first?.objectValue?["table"] == "notes")

        // b kept nothing of a's users.
        #expect(try run(["/usr/bin/find", b.dataDirectory, "-name", "fwd-*.sqlite"]).stdout.isEmpty)
        #expect(a.stop() == 0)
        #expect(b.stop() == 0)
    }

    /// Only a peer whose certificate the cluster's CA signed is served, and only
    /// io.userstore.Store; an owner that stops answering gets HostUnreachable after the
    /// forward timeout, and the transaction open over the link is rolled back on it.
    @Test func peersNeedTheClustersCertificateAndAnOwnerThatStopsAnsweringIsReported() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let certificates = try ClusterCertificates(["a": "127.0.0.1", "b": "127.0.0.1"])
        let rogue = try ClusterCertificates(["a": "127.0.0.1"]) // a CA of its own
        let a = try Self.daemon("a", port: 7113, etcd: etcd, store: store, certificates: certificates)
        let b = try Self.daemon("b", port: 7114, etcd: etcd, store: store, certificates: certificates, timeoutMilliseconds: 1500)
        try a.start()
        let toA = try a.connect()
        #expect(try Self.everyBucketAssigned(toA))

        // The listener's TLS, spoken by Python's ssl module.
        let served = try Self.probe(port: 7113, ca: certificates.ca, certificate: certificates.certificate("b"), key: certificates.key("b"))
        #expect(served["outcome"] as? String == "reply" && ((served["reply"] as? [String: Any])?["parameters"] as? [String: Any])?["user"] as? String == "probe", "\(served)")
        let noCertificate = try Self.probe(port: 7113, ca: certificates.ca)
        #expect(noCertificate["outcome"] as? String == "refused", "\(noCertificate)")
        let otherCA = try Self.probe(port: 7113, ca: certificates.ca, certificate: rogue.certificate("a"), key: rogue.key("a"))
        #expect(otherCA["outcome"] as? String == "refused", "\(otherCA)")
        let admin = try Self.probe(port: 7113, ca: certificates.ca, certificate: certificates.certificate("b"), key: certificates.key("b"),
                                   method: "io.userstore.Admin.Status", parameters: "{}")
        #expect(((admin["reply"] as? [String: Any])?["error"] as? String) == "io.userstore.Store.PermissionDenied", "\(admin)")
        #expect(a.stderr.contains("event=cluster-peer-refused"), "\(a.stderr.suffix(2000))")

        try b.start()
        let toB = try b.connect()
        toB.setReceiveTimeout(seconds: 60)
        #expect(try Self.everyBucketAssigned(toB))
        let transaction = try #require(try toB.call("io.userstore.Store.Begin", ["user": "held"])["transaction"])
        _ = try toB.call("io.userstore.Store.Execute", ["transaction": transaction, "sql": "INSERT INTO notes (title) VALUES ('never committed')"])

        // a stops answering (SIGSTOP, shorter than its lease: its buckets stay a's).
        kill(a.pid, SIGSTOP)
        let started = ContinuousClock.now
        do {
            _ = try toB.call("io.userstore.Store.Query", ["user": "held", "sql": "SELECT 1", "transaction": transaction])
            Issue.record("a paused owner answered")
        } catch let error as VarlinkError {
            #expect(error.name == "io.userstore.Store.HostUnreachable" && error.parameters["maybeApplied"] == true
                    && error.parameters["host"] == "a" && error.parameters["address"] == "127.0.0.1:7113", "\(error)")
        }
        let waited = ContinuousClock.now - started
        kill(a.pid, SIGCONT)
        #expect(waited >= .milliseconds(1500) && waited < .seconds(10), "\(waited)")
        // The link ended, and with it the transaction (rolled back on a); b's next call for the
        // user opens a new link.
        do {
            _ = try toB.call("io.userstore.Store.Commit", ["transaction": transaction])
            Issue.record("a transaction outlived its link")
        } catch let error as VarlinkError {
            #expect(error.name == "io.userstore.Store.NoSuchTransaction", "\(error)")
        }
        #expect(ClusterDaemonTests.eventually { (try? toB.call("io.userstore.Store.Query", ["user": "held", "sql": "SELECT count(*) FROM notes"]))?["rows"] == [[0]] })
        #expect(a.stop() == 0)

        // With a gone and b not yet its buckets' owner, a call is never sent: maybeApplied false
        // (or b already owns them and serves it).
        let answer = ClusterDaemonTests.answer(toB, "held").0
        #expect(["here", "io.userstore.Store.HostUnreachable", "io.userstore.Store.ClusterUnavailable"].contains(answer), "\(answer)")
        #expect(b.stop() == 0)
    }
}
