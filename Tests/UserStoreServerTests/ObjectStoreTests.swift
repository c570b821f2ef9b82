import DaemonTestSupport
import ClusterTestSupport
import Foundation
import Testing
import Varlink

/// Replication to a real S3 API — SeaweedFS on 127.0.0.1, a bucket, nothing else shared — looked
/// into with boto3 (Tests/Helpers/s3-probe.py), never with the project's own S3 client: the
/// disaster, a user's erase, Litestream's environment, misconfigurations, and the bucket going
/// away (killed, cut off for 30 s, refusing the credentials) while writes go on.
@Suite(.serialized) struct ObjectStoreTests {
    /// A daemon replicating to `bucket` (made here) on `server`, through `endpoint` when a proxy
    /// stands in front; its environment carries the server's credentials.
    static func daemon(_ server: SeaweedFS, bucket: String, endpoint: String? = nil, extra: String = "") throws -> DaemonHarness {
        try server.createBucket(bucket)
        let daemon = try ReplicationTests.daemon(replicaURL: server.replicaURL(bucket: bucket, prefix: "users", endpoint: endpoint),
                                                 extra: "  durableTimeoutMilliseconds: 3000\n" + extra)
        daemon.environment = server.environment
        return daemon
    }

    /// `user`'s folder in the bucket (the store's own hash folders under the prefix).
    static func folder(of user: String, _ daemon: DaemonHarness) throws -> String {
        let url = try daemon.connect().call("io.userstore.Admin.Replication", ["user": .string(user)])["stores"]?.arrayValue?.first?["replica"]?.stringValue ?? ""
        // s3://bucket/users/ab/cd/user?endpoint=… → users/ab/cd/user/
        let path = url.dropFirst("s3://".count).split(separator: "?").first ?? ""
        return path.split(separator: "/").dropFirst().joined(separator: "/") + "/"
    }

    /// 200 users, SIGKILL of the daemon and Litestream, the data directory deleted, a new daemon
    /// on the same bucket: every durable write back, plain writes within the loss window.
    @Test func everyUserComesBackFromTheBucket() throws {
        let server = try SeaweedFS()
        let daemon = try Self.daemon(server, bucket: "disaster")
        try ReplicationTests().disaster(daemon, userCount: 200)
        // Litestream's LTX files under users/, or the host log's objects under log/.
        #expect(try server.keys("disaster", prefix: "").contains { $0.hasSuffix(".usl") })
    }

    /// One host on a bucket lists the users the bucket holds when it starts and keeps that index
    /// current: a new user then costs no request to the bucket — it is created even with the
    /// bucket cut off — while a user the bucket holds and this disk lacks is never created empty.
    @Test func theBucketsIndexCreatesNewUsersWithoutAskingIt() throws {
        let server = try SeaweedFS()
        let proxy = try CuttableProxy(to: server.port)
        let daemon = try Self.daemon(server, bucket: "index", endpoint: "http://127.0.0.1:\(proxy.port)")
        try daemon.start()
        let first = try daemon.connect()
        // A store opened before Litestream first answers is registered by the health check
        // later, and a durable write to it is refused meanwhile (seen once under the full suite's load).
        #expect(try DurabilityTests.waitUntilHealthy(first))
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('kept')", for: "kept", on: first, durable: true)
        daemon.stop()
        // The disk lost; a daemon on the same bucket lists it before the bucket goes away.
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let client = try daemon.connect()
        #expect(try DurabilityTests.waitForReplication(client) { $0["replicaIndexUsers"] == 1 })
        proxy.cut()
        #expect(try client.call("io.userstore.Store.Open", ["user": "fresh"])["created"] == true)
        let unavailable = { (name: String) in name.hasSuffix(".ReplicationUnavailable") }
        do {
            let reply = try client.call("io.userstore.Store.Open", ["user": "kept"])
            Issue.record("a user the bucket holds was opened with the bucket cut off: \(reply)")
        } catch let error as VarlinkError {
            #expect(unavailable(error.name), "\(error)")
        }
        proxy.mend()
        #expect(try client.call("io.userstore.Store.Query", ["user": "kept", "sql": "SELECT title FROM notes"])["rows"] == [["kept"]])
        daemon.stop()
    }

    /// Litestream's S3 client fails at once when `AWS_CA_BUNDLE` is set; the daemon runs
    /// `litestream restore` (a copy in Litestream's layout, read once) with an environment of its
    /// own, so a host that sets it restores all the same.
    @Test func aHostsAWSCABundleDoesNotReachLitestream() throws {
        let server = try SeaweedFS()
        let daemon = try Self.daemon(server, bucket: "cabundle")
        try daemon.start()
        #expect(daemon.stop() == 0)
        try LitestreamCopies.write("cy", titles: ["from litestream"], replica: server.replicaURL(bucket: "cabundle", prefix: "users"),
                                   folder: try LitestreamCopies.folder(of: "cy"), environment: server.environment)
        let bundle = daemon.directory.path + "/ca.pem"
        try "not a certificate\n".write(toFile: bundle, atomically: true, encoding: .utf8)
        daemon.environment["AWS_CA_BUNDLE"] = bundle
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let client = try daemon.connect()
        #expect(try client.call("io.userstore.Store.Query", ["user": "cy", "sql": "SELECT title FROM notes"])["rows"] == [["from litestream"]])
        daemon.stop()
    }

    /// A wrong secret or a missing bucket stops the daemon at start (78) with the error's name;
    /// an endpoint nobody serves is served degraded, and says so by name in Status and in
    /// `userstorectl replication`; no credentials at all is a configuration error.
    @Test func misconfigurationsAreNamed() throws {
        let server = try SeaweedFS()
        try server.createBucket("present")
        func refused(_ daemon: DaemonHarness) throws -> (status: Int32, stderr: String) {
            try daemon.start(waitForReady: false)
            return (daemon.waitForExit(), daemon.stderr)
        }
        let wrongSecret = try ReplicationTests.daemon(replicaURL: server.replicaURL(bucket: "present", prefix: "u"))
        wrongSecret.environment = ["AWS_ACCESS_KEY_ID": SeaweedFS.accessKey, "AWS_SECRET_ACCESS_KEY": "not-the-secret"]
        let denied = try refused(wrongSecret)
        #expect(denied.status == 78 && denied.stderr.contains("ReplicaAccessDenied"), "\(denied)")

        let noBucket = try ReplicationTests.daemon(replicaURL: server.replicaURL(bucket: "absent", prefix: "u"))
        noBucket.environment = server.environment
        let missing = try refused(noBucket)
        #expect(missing.status == 78 && missing.stderr.contains("ReplicaBucketMissing"), "\(missing)")

        let noCredentials = try ReplicationTests.daemon(replicaURL: server.replicaURL(bucket: "present", prefix: "u"))
        noCredentials.environment = ["AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "LITESTREAM_ACCESS_KEY_ID": "", "LITESTREAM_SECRET_ACCESS_KEY": ""]
        let anonymous = try refused(noCredentials)
        #expect(anonymous.status == 78 && anonymous.stderr.contains("needs credentials"), "\(anonymous)")

        let port = try EtcdCluster.freePorts(1)[0]
        let nobody = try ReplicationTests.daemon(replicaURL: server.replicaURL(bucket: "present", prefix: "u", endpoint: "http://127.0.0.1:\(port)"))
        nobody.environment = server.environment
        try nobody.start()
        let status = try nobody.connect().call("io.userstore.Admin.Status")["replication"]
        #expect(status?["state"] == "degraded" && status?["replicaProblem"]?.stringValue?.contains("ReplicaUnreachable") == true, "\(String(describing: status))")
        let ctl = try run([userstorectlPath, "replication"], environment: ["USERSTORE_SOCKET": nobody.socketPath])
        #expect(ctl.status == 1 && ctl.stdout.contains("replica: ReplicaUnreachable"), "\(ctl)")
        nobody.stop()
    }

    /// The bucket gone while writes go on — SeaweedFS killed, then started again; the endpoint
    /// cut off for 30 s; the access key revoked, then restored: plain writes are served, durable
    /// ones fail with ReplicationUnavailable within their time-out, Status names the problem;
    /// once the bucket is back, a durable write is acknowledged within 30 s (each store compared
    /// with its replica first), and after a host loss the restored store equals the live one.
    @Test(arguments: ["killed", "cut off", "credentials revoked"])
    func theBucketGoesAwayAndComesBack(fault: String) throws {
        let server = try SeaweedFS()
        let proxy = try CuttableProxy(to: server.port)
        let daemon = try Self.daemon(server, bucket: "faults", endpoint: "http://127.0.0.1:\(proxy.port)")
        try daemon.start()
        let client = try daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "flo", on: client, durable: true)
        try DurabilityTests.writeBlob(2_000_000, for: "flo", on: client)
        let expected: String
        switch fault {
        case "killed": server.stop(); expected = "ReplicaUnreachable"
        case "cut off": proxy.cut(); expected = "ReplicaUnreachable"
        default: try server.setAccessKey(allowed: false); expected = "ReplicaAccessDenied"
        }
        let faultStarted = ContinuousClock.now
        var written = 0
        var durableWaits: [Duration] = []
        let until = ContinuousClock.now + .seconds(fault == "cut off" ? 30 : 10)
        while ContinuousClock.now < until {
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('during \(written)')", for: "flo", on: client)
            written += 1
            if written % 20 == 0 {
                let started = ContinuousClock.now
                #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
                    try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable during')", for: "flo", on: client, durable: true)
                })
                durableWaits.append(ContinuousClock.now - started)
            }
        }
        #expect(durableWaits.allSatisfy { $0 <= .milliseconds(3300) }, "durable writes waited \(durableWaits.max()!) against a 3 s time-out")
        let status = try client.call("io.userstore.Admin.Status")["replication"]
        #expect(status?["state"] == "degraded", "\(String(describing: status))")
        #expect([status?["replicaProblem"], status?["lastError"]].contains { $0?.stringValue?.contains(expected) == true }, "\(String(describing: status))")

        switch fault {
        case "killed": try server.start()
        case "cut off": proxy.mend()
        default: try server.setAccessKey(allowed: true)
        }
        let back = ContinuousClock.now
        var acknowledged = false
        while !acknowledged && ContinuousClock.now - back < .seconds(30) {
            acknowledged = (try? DurabilityTests.execute("INSERT INTO notes (title) VALUES ('caught up')", for: "flo", on: client, durable: true)) != nil
        }
        #expect(acknowledged, "no durable write acknowledged within 30 s of the bucket's return")
        print("object store \(fault): \(written) plain writes during \(ContinuousClock.now - faultStarted - (ContinuousClock.now - back)), durable waits up to \(durableWaits.max() ?? .zero), acknowledged again \(ContinuousClock.now - back) after the return")
        #expect(try DurabilityTests.waitUntilHealthy(client))
        try DurabilityTests.acknowledgeThenLoseTheHost("flo", daemon, client)
    }
}
