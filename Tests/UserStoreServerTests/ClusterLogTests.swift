import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import UserStoreCluster
import UserStoreCore
import Varlink

/// The daemon's own log in a cluster (`replication.engine: log` with `cluster.*`): a host that
/// takes a bucket fences the log for it before it reads any of its users, so that what the old
/// owner — paused, cut off from the bucket — uploads afterwards is never applied, neither by a
/// restore nor by the old owner's fold (docs/design.md, "The host log").
@Suite(.serialized) struct ClusterLogTests {
    /// A host of the cluster on the log, its replica reached at `endpoint` (a proxy) if given.
    static func daemon(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS, endpoint: String? = nil,
                       foldSeconds: Int = 3600, durableTimeoutMilliseconds: Int = 3000) throws -> DaemonHarness {
        let daemon = try DaemonHarness(extraConfig: Self.configuration(host, port: port, etcd: etcd, store: store, endpoint: endpoint,
                                                                      foldSeconds: foldSeconds, durableTimeoutMilliseconds: durableTimeoutMilliseconds))
        daemon.environment = store.environment
        return daemon
    }

    /// The YAML of ``daemon(_:port:etcd:store:endpoint:foldSeconds:durableTimeoutMilliseconds:)``.
    static func configuration(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS, endpoint: String? = nil,
                              foldSeconds: Int = 3600, durableTimeoutMilliseconds: Int = 3000) -> String {
        ClusterDaemonTests.configuration(host, port: port, etcd: etcd, store: store, endpoint: endpoint,
                                         replication: "  durableTimeoutMilliseconds: \(durableTimeoutMilliseconds)\n  foldSeconds: \(foldSeconds)")
    }

    /// Two hosts: a, which reaches the replica through a proxy and owns cleo's bucket, and b.
    /// cleo has one row stored in the replica, then — the proxy cut — one row committed on a
    /// and not stored.
    final class CutOwner {
        let etcd: EtcdCluster
        let store: SeaweedFS
        let proxy: CuttableProxy
        let a: DaemonHarness, b: DaemonHarness
        let toA: VarlinkConnection, toB: VarlinkConnection

        init(ports: (a: Int, b: Int), durableTimeoutMilliseconds: Int = 3000) throws {
            etcd = try EtcdCluster(size: 1)
            store = try ClusterDaemonTests.objectStore()
            proxy = try CuttableProxy(to: store.port)
            a = try ClusterLogTests.daemon("a", port: ports.a, etcd: etcd, store: store, endpoint: "http://127.0.0.1:\(proxy.port)",
                                           durableTimeoutMilliseconds: durableTimeoutMilliseconds)
            b = try ClusterLogTests.daemon("b", port: ports.b, etcd: etcd, store: store)
            try a.start()
            let toA = try a.connect()
            #expect(ClusterDaemonTests.eventually { ClusterDaemonTests.answer(toA, "cleo").0 == "here" })
            try b.start()
            let toB = try b.connect()
            #expect(ClusterDaemonTests.eventually { ClusterDaemonTests.answer(toB, "cleo").0 == "a" })
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('stored')", for: "cleo", on: toA, durable: true)
            proxy.cut()
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('not yet stored')", for: "cleo", on: toA)
            (self.toA, self.toB) = (toA, toB)
        }
    }

    /// A user other than `user` in `user`'s bucket.
    static func neighbour(of user: String) throws -> String {
        let bucket = Placement.bucket(for: try UserID(user))
        for index in 0... where Placement.bucket(for: try UserID("neighbour-\(index)")) == bucket { return "neighbour-\(index)" }
        fatalError("unreachable")
    }

    /// Host a commits bob's late rows while the bucket cannot be reached, is paused until b takes
    /// its buckets and fences them, then reaches the bucket again and uploads the late rows; b
    /// restores bob without them. With `folded`, a's fold (every second) has folded and deleted
    /// its objects before b reads bob: the fold too leaves out what the fence voids.
    @Test(arguments: [false, true]) func whatAnOldOwnerUploadsAfterItsBucketWasTakenNeverCounts(folded: Bool) throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let proxy = try CuttableProxy(to: store.port)
        let a = try Self.daemon("a", port: 7121, etcd: etcd, store: store, endpoint: "http://127.0.0.1:\(proxy.port)", foldSeconds: folded ? 1 : 3600)
        let b = try Self.daemon("b", port: 7122, etcd: etcd, store: store)
        try a.start()
        let toA = try a.connect()
        #expect(ClusterDaemonTests.eventually { ClusterDaemonTests.answer(toA, "bob").0 == "here" })
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('acknowledged')", for: "bob", on: toA, durable: true)
        proxy.cut()
        for index in 0..<3 { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('late \(index)')", for: "bob", on: toA) }
        try b.start()
        let toB = try b.connect()
        #expect(ClusterDaemonTests.eventually { ClusterDaemonTests.answer(toB, "bob").0 == "a" })

        // a paused past its etcd lease: b takes its buckets, and fences bob's as it opens a
        // neighbour of bob's (bob himself is not read yet).
        kill(a.pid, SIGSTOP)
        let neighbour = try Self.neighbour(of: "bob")
        let taken = ContinuousClock.now + .seconds(60)
        while ClusterDaemonTests.answer(toB, neighbour).0 != "here" {
            try #require(ContinuousClock.now < taken, "b did not take a's buckets within 60 s: \(b.stderr.suffix(2000))")
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(b.stderr.contains("event=cluster-buckets-fenced"))

        // a resumes and reaches the bucket: it uploads the late rows (its own count says so).
        kill(a.pid, SIGCONT)
        proxy.mend()
        func uploads() throws -> (written: Int64, pending: Int64) {
            let log = try toA.call("io.userstore.Admin.Status")["replication"]?["log"]
            return (log?["objectsWritten"]?.integerValue ?? -1, log?["pendingBytes"]?.integerValue ?? -1)
        }
        let uploaded = ContinuousClock.now + .seconds(60)
        while try uploads().pending != 0 {
            try #require(ContinuousClock.now < uploaded, "a did not upload its late rows within 60 s: \(a.stderr.suffix(2000))")
            Thread.sleep(forTimeInterval: 0.1)
        }
        let lateRecords = try ClusterDaemonTests.logRecords(of: "bob", in: store).filter { $0.kind == .commit }.count
        if folded {
            // a folds its own objects (it owns no bucket now): every one of them goes.
            let binding = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: a.dataDirectory + "/replica.json"))) as? [String: Any]
            let directory = try #require(binding?["dataDirectory"] as? String)
            let deadline = ContinuousClock.now + .seconds(60)
            while try store.keys("cluster", prefix: "users/log/\(directory)/").contains(where: { $0.hasSuffix(".usl") }) {
                try #require(ContinuousClock.now < deadline, "a did not fold its log within 60 s: \(a.stderr.suffix(2000))")
                Thread.sleep(forTimeInterval: 0.2)
            }
            #expect(!a.stderr.contains("folding the log into per-user objects failed"), "\(a.stderr.suffix(2000))")
        } else {
            #expect(lateRecords >= 2, "the late rows are not in the bucket: the test would prove nothing")
        }
        #expect(try LogEngineTests.titles("bob", toB) == ["acknowledged"], "what the old owner uploaded after the fence was applied")
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('on b')", for: "bob", on: toB, durable: true)
        #expect(try LogEngineTests.titles("bob", toB) == ["acknowledged", "on b"])
        #expect(b.stop() == 0)
        #expect(a.stop() == 0)
    }

    /// A cluster switching from Litestream to the log: a user replicated by Litestream (in the
    /// cluster's layout, `<bucket>/<user>/e<epoch>/`, shipped by `litestream replicate`), the
    /// host started on the log — the user comes back from the Litestream copy once, then from the
    /// log, with every write, after the disk is lost again.
    @Test func aClusterOnLitestreamSwitchesToTheLogAndLosesNothing() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let a = try Self.daemon("a", port: 7125, etcd: etcd, store: store)
        let bucket = Placement.bucket(for: try UserID("dana"))
        try LitestreamCopies.write("dana", titles: ["on litestream"], replica: store.replicaURL(bucket: "cluster", prefix: "users"), folder: "/\(bucket)/dana/e1",
                                   environment: store.environment)
        func loseTheDiskAndStart() throws -> VarlinkConnection {
            if FileManager.default.fileExists(atPath: a.dataDirectory) { try FileManager.default.removeItem(atPath: a.dataDirectory) }
            try a.start()
            let client = try a.connect()
            #expect(ClusterDaemonTests.eventually { ClusterDaemonTests.answer(client, "dana").0 == "here" }, "\(a.stderr.suffix(2000))")
            return client
        }
        let onLog = try loseTheDiskAndStart()
        #expect(try LogEngineTests.titles("dana", onLog) == ["on litestream"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('on the log')", for: "dana", on: onLog, durable: true)
        a.stop(signal: SIGKILL)
        // Its lease left to run out (3 s): the host starting again joins as a new one.
        let again = try loseTheDiskAndStart()
        #expect(try LogEngineTests.titles("dana", again) == ["on litestream", "on the log"])
        #expect(a.stop() == 0)
    }

    /// A bucket moved while the replica cannot be reached: its owner closes the bucket's stores
    /// but releases it only once their last commits are in the replica; until then the bucket
    /// stays its own (users get Retry), and once the replica answers the new owner gets every
    /// committed row.
    @Test func aMoveReleasesTheBucketOnlyOnceItsLastCommitsAreStored() throws {
        let cut = try CutOwner(ports: (7123, 7124))
        let (proxy, a, b, toB) = (cut.proxy, cut.a, cut.b, cut.toB)

        let bucket = Placement.bucket(for: try UserID("cleo"))
        let move = try run([userstorectlPath, "cluster", "move", "\(bucket)", "b"], environment: ["USERSTORE_SOCKET": b.socketPath])
        #expect(move.status == 0, "\(move)")
        // a sees the bucket draining and closes cleo's store, but cannot store its last commit:
        // the bucket is not released (b does not own it) while the replica is out of reach.
        let other = try a.connect()
        #expect(try ClusterDaemonTests.eventually { try other.call("io.userstore.Admin.Cluster")["movingBuckets"] == 1 })
        let held = ContinuousClock.now + .seconds(8) // two durable time-outs: two tries to release
        while ContinuousClock.now < held {
            #expect(ClusterDaemonTests.answer(toB, "cleo").0 != "here", "the bucket was released before its last commit was stored")
            Thread.sleep(forTimeInterval: 0.5)
        }
        #expect(a.stderr.contains("not releasing 1 moving buckets yet"), "\(a.stderr.suffix(2000))")

        proxy.mend()
        let deadline = ContinuousClock.now + .seconds(60)
        while ClusterDaemonTests.answer(toB, "cleo").0 != "here" {
            try #require(ContinuousClock.now < deadline, "the bucket did not move within 60 s of the replica's return: \(a.stderr.suffix(2000))")
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(try LogEngineTests.titles("cleo", toB) == ["stored", "not yet stored"])
        #expect(a.stderr.contains("event=cluster-bucket-released"))
        #expect(a.stop() == 0)
        #expect(b.stop() == 0)
    }

    /// A host stopped while the replica cannot be reached: its stores close at once (a close
    /// does not wait for a log that fails), and it leaves the cluster only once the log stored
    /// their last commits — the replica answers again here 5 s into the stop — so the next
    /// owner gets every committed row. It used to leave first and flush after, and the next
    /// owner's fence could come before the last commits.
    @Test func aStoppingHostLeavesOnlyOnceItsLastCommitsAreStored() throws {
        let cut = try CutOwner(ports: (7125, 7126), durableTimeoutMilliseconds: 15000)
        let (proxy, a, b, toA, toB) = (cut.proxy, cut.a, cut.b, cut.toA, cut.toB)
        #expect(try DurabilityTests.waitForReplication(toA) { $0["state"] == "degraded" })

        nonisolated(unsafe) let stopping = a // stopped by that thread alone
        let stopped = DispatchSemaphore(value: 0)
        Thread {
            _ = stopping.stop()
            stopped.signal()
        }.start()
        #expect(ClusterDaemonTests.eventually { a.stderr.contains("event=daemon-stopping") })
        // a's stores are closed by now, their last commit not stored: a stays in the cluster,
        // and cleo's bucket a's, until it is.
        let held = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < held {
            #expect(ClusterDaemonTests.answer(toB, "cleo").0 != "here", "a left the cluster before its last commits were stored")
            Thread.sleep(forTimeInterval: 0.5)
        }
        proxy.mend()
        #expect(stopped.wait(timeout: .now() + 60) == .success, "a did not stop")
        let deadline = ContinuousClock.now + .seconds(60)
        while ClusterDaemonTests.answer(toB, "cleo").0 != "here" {
            try #require(ContinuousClock.now < deadline, "b did not take cleo's bucket within 60 s of a's stop")
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(try LogEngineTests.titles("cleo", toB) == ["stored", "not yet stored"])
        #expect(!a.stderr.contains("stopping with records the log did not store"), "\(a.stderr.suffix(2000))")
        #expect(b.stop() == 0)
    }
}
