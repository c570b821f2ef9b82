import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import UserStoreReplication
import Varlink

/// One writer per replica with one host (docs/replication.md, "One writer"): two daemons on one
/// replica — a second started while the first runs, a first paused (SIGSTOP) past its lease and
/// resumed after the second took over, an operator's take-over — never both acknowledge, and a
/// fresh host restores every acknowledged row. On a `file://` folder and on S3 (SeaweedFS).
@Suite(.serialized) struct WriterLeaseTests {
    /// Two daemons on one replica (`file` or `s3`), each with its own data directory.
    final class Pair {
        let replica: TemporaryDirectory
        let server: SeaweedFS?
        let first: DaemonHarness
        let second: DaemonHarness

        init(_ kind: String, leaseSeconds: Int) throws {
            replica = try TemporaryDirectory()
            server = kind == "s3" ? try SeaweedFS() : nil
            let extra = "  durableTimeoutMilliseconds: 3000\n  leaseSeconds: \(leaseSeconds)\n"
            if let server {
                try server.createBucket("lease")
                let url = server.replicaURL(bucket: "lease", prefix: "users")
                first = try ReplicationTests.daemon(replicaURL: url, extra: extra)
                second = try ReplicationTests.daemon(replicaURL: url, extra: extra)
                first.environment = server.environment
                second.environment = server.environment
            } else {
                first = try ReplicationTests.daemon(replica: replica.path, extra: extra)
                second = try ReplicationTests.daemon(replica: replica.path, extra: extra)
            }
        }

        /// The first host gone, the second takes the replica, writes `title` to ann durably and
        /// stops.
        func secondWritesAlone(_ title: String) throws {
            try second.start()
            let client = try second.connect()
            #expect(try WriterLeaseTests.waitForLease(client, "holding"))
            try WriterLeaseTests.durable(title, client)
            #expect(second.stop() == 0)
        }

        /// Every daemon SIGKILLed, and a third on an empty disk: `user`'s
        /// rows, as it restores them.
        func restoreOnAFreshHost(_ user: String) throws -> [String] {
            for daemon in [first, second] where daemon.process != nil {
                kill(daemon.pid, SIGCONT)
                daemon.stop(signal: SIGKILL)
            }
            let fresh = try DaemonHarness(extraConfig: try String(contentsOfFile: first.configPath, encoding: .utf8)
                .split(separator: "\n").drop { !$0.hasPrefix("replication:") }.joined(separator: "\n"))
            fresh.environment = first.environment
            try fresh.start()
            defer { fresh.stop() }
            let client = try fresh.connect()
            #expect(try WriterLeaseTests.waitForLease(client, "holding"))
            return try WriterLeaseTests.titles(of: user, on: client)
        }
    }

    static func titles(of user: String, on client: VarlinkConnection) throws -> [String] {
        (try client.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT title FROM notes ORDER BY id"])["rows"]?.arrayValue ?? [])
            .compactMap { $0.arrayValue?.first?.stringValue }
    }

    /// Waits (Status, at most 60 s) until the daemon's writer lease is in `state`.
    static func waitForLease(_ client: VarlinkConnection, _ state: String) throws -> Bool {
        try DurabilityTests.waitForReplication(client) { $0["lease"]?["state"]?.stringValue == state }
    }

    static func durable(_ title: String, _ client: VarlinkConnection, user: String = "ann") throws {
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(title)')", for: user, on: client, durable: true)
    }

    static func refused(_ body: () throws -> Any) -> Bool {
        ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable", body)
    }

    /// A second host started on a replica the first holds serves nothing and acknowledges no
    /// durable write; once the first is lost (SIGKILL), it takes the replica over by itself and
    /// acknowledges again; a fresh host restores every row either acknowledged.
    @Test(arguments: ["file", "s3"]) func aSecondHostAcknowledgesNothingWhileTheFirstHoldsTheReplica(kind: String) throws {
        let pair = try Pair(kind, leaseSeconds: 3)
        try pair.first.start()
        let first = try pair.first.connect()
        try Self.durable("first 1", first)
        try pair.second.start()
        let second = try pair.second.connect()
        let lease = try second.call("io.userstore.Admin.Status")["replication"]?["lease"]
        #expect(lease?["state"] == "standby" && lease?["holder"] != nil, "\(String(describing: lease))")
        #expect(Self.refused { try Self.durable("second 1", second) }, "the second host acknowledged a durable write")
        #expect(Self.refused { try second.call("io.userstore.Store.Open", ["user": "bob"]) })
        try Self.durable("first 2", first)

        let killedAt = ContinuousClock.now
        kill(pair.first.pid, SIGKILL)
        pair.first.waitForExit()
        #expect(try Self.waitForLease(second, "holding"))
        let tookOver = ContinuousClock.now - killedAt
        #expect(tookOver < .seconds(3 + 5), "took \(tookOver) to take the replica over")
        try Self.durable("second 2", second)
        #expect(try Self.titles(of: "ann", on: second) == ["first 1", "first 2", "second 2"])
        #expect(try pair.restoreOnAFreshHost("ann") == ["first 1", "first 2", "second 2"])
    }

    /// A store whose epoch is unknown here — no position beside it, as a crash leaves a new
    /// store cut short in its creation (it is registered with the log only once migrated) — is
    /// not taken for current when the log holds the user: the second host wrote to it while the
    /// first was away, so the first sets its copy aside and restores the log's, the second's
    /// write in it, instead of shipping its own copy over it.
    @Test(arguments: ["file", "s3"]) func aStoreWithoutItsEpochIsNotTakenForCurrentWhenTheLogHoldsTheUser(kind: String) throws {
        let pair = try Pair(kind, leaseSeconds: 3)
        try pair.first.start()
        try Self.durable("first", try pair.first.connect())
        #expect(pair.first.stop() == 0)
        #expect(unlink(LogPosition.path(of: try DurabilityTests.storePath("ann", pair.first))) == 0)

        try pair.secondWritesAlone("second")

        try pair.first.start()
        let first = try pair.first.connect()
        #expect(try Self.waitForLease(first, "holding"))
        #expect(try Self.titles(of: "ann", on: first) == ["first", "second"])
        #expect(pair.first.stderr.contains("event=store-superseded"))
        #expect(try pair.restoreOnAFreshHost("ann") == ["first", "second"])
    }

    /// A store left with its WAL by a crash is opened as is when the daemon starts (the fleet
    /// index reads its version through SQLite). That open too sets aside a copy another host
    /// wrote past since and restores the log's: it does not ship the stale copy as a base over
    /// the second host's write.
    @Test(arguments: ["file", "s3"]) func aCrashedHostsStaleCopyOpenedAsIsAtStartIsSetAside(kind: String) throws {
        let pair = try Pair(kind, leaseSeconds: 3)
        try pair.first.start()
        try Self.durable("first", try pair.first.connect())
        pair.first.stop(signal: SIGKILL) // ann's WAL stays

        try pair.secondWritesAlone("second")

        try pair.first.start()
        let first = try pair.first.connect()
        try first.stream("io.userstore.Admin.ListStores") { _ in } // answers once the index has read every store
        #expect(try Self.titles(of: "ann", on: first) == ["first", "second"])
        #expect(try pair.restoreOnAFreshHost("ann") == ["first", "second"])
    }

    /// The first host paused (SIGSTOP: a VM migration, a hypervisor stall) past its lease; the
    /// second takes over once it has seen the lease unrenewed that long and acknowledges; the
    /// first, resumed, acknowledges nothing — and what its Litestream still uploads goes under the
    /// old epoch, which no restore reads: a fresh host has the second's row.
    @Test(arguments: ["file", "s3"]) func aPausedHostResumedAfterATakeOverAcknowledgesNothing(kind: String) throws {
        let pair = try Pair(kind, leaseSeconds: 3)
        try pair.first.start()
        let first = try pair.first.connect()
        try Self.durable("before pause", first)
        try pair.second.start()
        let second = try pair.second.connect()
        #expect(try Self.waitForLease(second, "standby"))

        kill(pair.first.pid, SIGSTOP)
        #expect(try Self.waitForLease(second, "holding"))
        let taken = try second.call("io.userstore.Admin.Status")["replication"]?["lease"]
        try Self.durable("taken over", second)

        kill(pair.first.pid, SIGCONT)
        let resumed = try pair.first.connect()
        for index in 0..<3 {
            #expect(Self.refused { try Self.durable("resumed \(index)", resumed) }, "the resumed host acknowledged a durable write")
        }
        #expect(try Self.waitForLease(resumed, "standby"))
        #expect(try resumed.call("io.userstore.Admin.Status")["replication"]?["lease"]?["epoch"] == taken?["epoch"])
        #expect(Self.refused { try resumed.call("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT 1"]) })
        try Self.durable("after resume", second)
        let rows = try pair.restoreOnAFreshHost("ann")
        #expect(rows.starts(with: ["before pause", "taken over"]) && rows.last == "after resume", "\(rows)")
        #expect(!rows.contains { $0.hasPrefix("resumed") }, "\(rows)")
    }

    /// `userstorectl replication take-over` takes a lease whose holder is alive but paused at
    /// once (a lease of 60 s would otherwise make the second host wait); the first host, resumed,
    /// is fenced.
    @Test func anOperatorTakesTheReplicaOverAtOnce() throws {
        let pair = try Pair("file", leaseSeconds: 60)
        try pair.first.start()
        let first = try pair.first.connect()
        try Self.durable("first", first)
        kill(pair.first.pid, SIGSTOP)
        try pair.second.start()
        let second = try pair.second.connect()
        #expect(try Self.waitForLease(second, "standby"))
        #expect(Self.refused { try Self.durable("too early", second) })

        let took = try run([userstorectlPath, "--socket", pair.second.socketPath, "replication", "take-over", "--json"])
        #expect(took.status == 0, "\(took.stdout)\(took.stderr)")
        let reply = try JSONParser().parse(took.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(reply["previousHolder"] != nil && (reply["epoch"]?.integerValue ?? 0) > (reply["previousEpoch"]?.integerValue ?? .max))
        try Self.durable("second", second)

        kill(pair.first.pid, SIGCONT)
        #expect(Self.refused { try Self.durable("resumed", try pair.first.connect()) })
        #expect(try pair.restoreOnAFreshHost("ann") == ["first", "second"])
    }

    /// An operator's take-over while the first host runs and acknowledges durable writes (not
    /// paused): it cannot know at once and acknowledges for up to a few seconds more (it looks at
    /// the lease every second, not per write). The second host fences the log only once the
    /// first cannot acknowledge any more — so a fresh host restores every row the first
    /// acknowledged, before the take-over and after, and the second's.
    @Test(arguments: ["file", "s3"]) func aRunningHostsAcknowledgedWritesSurviveAnOperatorsTakeOver(kind: String) throws {
        let pair = try Pair(kind, leaseSeconds: 60)
        try pair.first.start()
        try Self.durable("first 0", try pair.first.connect())
        try pair.second.start()
        let second = try pair.second.connect()
        #expect(try Self.waitForLease(second, "standby"))

        // A writer on the first host: durable writes one after another until five in a row are
        // refused (the first found the lease lost).
        nonisolated(unsafe) let writerClient = try pair.first.connect()
        let acknowledged = Mutex<[String]>([])
        let underWay = DispatchSemaphore(value: 0), finished = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            defer { finished.signal() }
            var refusedInARow = 0, index = 0
            while refusedInARow < 5 {
                index += 1
                do {
                    try Self.durable("first \(index)", writerClient)
                    acknowledged.withLock { $0.append("first \(index)") }
                    refusedInARow = 0
                } catch {
                    refusedInARow += 1
                }
                if index == 20 { underWay.signal() }
            }
        }
        try #require(underWay.wait(timeout: .now() + 60) == .success, "the first host's writer did not get under way")
        let took = try run([userstorectlPath, "--socket", pair.second.socketPath, "replication", "take-over"])
        #expect(took.status == 0, "\(took.stdout)\(took.stderr)")
        try Self.durable("second", second)
        try #require(finished.wait(timeout: .now() + 120) == .success, "the first host still acknowledges two minutes after the take-over")

        let rows = try pair.restoreOnAFreshHost("ann")
        let written = acknowledged.withLock { $0 }
        #expect(written.count >= 19)
        let lost = written.filter { !rows.contains($0) }
        #expect(lost.isEmpty, "the first host acknowledged \(written.count) writes; a fresh host lacks \(lost)")
        #expect(rows.contains("second") && rows.first == "first 0", "\(rows)")
    }
}
