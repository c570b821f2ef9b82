import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import UserStoreCluster
import UserStoreCore
import Varlink

/// A release across three hosts (docs/releases.md): one release in etcd, the same on every
/// host; a halt on the host whose stores failed stops the rollout on all of them.
@Suite(.serialized) struct ClusterReleaseTests {
    /// The cluster's daemon with a rollout policy: one step, halting past 1%.
    static func daemon(_ host: String, port: Int, etcd: EtcdCluster, store: SeaweedFS) throws -> DaemonHarness {
        try ClusterDaemonTests.daemon(host, port: port, etcd: etcd, store: store,
                                      extraConfig: "rollout:\n  steps: [100%]\n  haltOn: 1%\n  wait: 1h")
    }

    private func release(_ daemon: DaemonHarness) throws -> [String: JSONValue] {
        let result = try run([userstorectlPath, "release", "status", "--json", "--socket", daemon.socketPath])
        return (try? JSONParser().parse(Array(result.stdout.utf8)).objectValue) ?? [:]
    }

    /// Each host's release state.
    private func states(_ hosts: [DaemonHarness]) throws -> [String] {
        try hosts.map { try release($0)["state"]?.stringValue ?? "?" }
    }

    /// Asks every host until all their releases are in `state` (at most 30 s); returns whether
    /// they were, and the states seen last.
    private func eventually(_ hosts: [DaemonHarness], are state: String) throws -> (Bool, [String]) {
        var seen: [String] = []
        let reached = try ClusterDaemonTests.eventually {
            seen = try states(hosts)
            return seen.allSatisfy { $0 == state }
        }
        return (reached, seen)
    }

    /// Three hosts on `ports` (named a, b, c), started, the buckets spread over them; returns
    /// them, a client of each, and which host (index) owns each of `users`.
    private func threeHosts(_ ports: [Int], users: [String], etcd: EtcdCluster, store: SeaweedFS) throws
        -> (hosts: [DaemonHarness], clients: [VarlinkConnection], owner: [String: Int]) {
        let hosts = try zip(["a", "b", "c"], ports).map { try Self.daemon($0.0, port: $0.1, etcd: etcd, store: store) }
        for host in hosts { try host.start() }
        let clients = try hosts.map { try $0.connect() }
        // a took every bucket; the controller spreads them over the three.
        #expect(ClusterDaemonTests.eventually { users.allSatisfy { ClusterDaemonTests.answer(clients[0], $0).0 != "io.userstore.Store.ClusterUnavailable" } })
        _ = try clients[0].call("io.userstore.Admin.Rebalance")
        var owner: [String: Int] = [:]
        #expect(ClusterDaemonTests.eventually {
            owner = [:]
            for user in users {
                for (index, client) in clients.enumerated() where ClusterDaemonTests.answer(client, user).0 == "here" { owner[user] = index }
            }
            return owner.count == users.count && Set(owner.values).count == 3
        }, "\(owner)")
        return (hosts, clients, owner)
    }

    /// The migration `file` (`sql`) added to every host and reloaded; returns once every host has the same
    /// release, running.
    private func startRelease(_ file: String, _ sql: String, on hosts: [DaemonHarness], _ clients: [VarlinkConnection]) throws {
        for (index, host) in hosts.enumerated() {
            try host.addMigration(file, sql)
            _ = try clients[index].call("io.userstore.Admin.Reload")
        }
        var ids: Set<String> = []
        #expect(try ClusterDaemonTests.eventually {
            ids = Set(try hosts.map { try release($0)["id"]?.stringValue ?? "" })
            return ids.count == 1 && !ids.contains("")
        }, "\(ids)")
        let first = try release(hosts[0])
        #expect(first["state"] == "running", "\(first)\n\(hosts[0].stderr.suffix(4000))\n\(hosts[1].stderr.suffix(4000))")
    }

    @Test(.timeLimit(.minutes(10)))
    func aHaltOnOneHostStopsTheRolloutOnAllThree() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let users = (0..<60).map { "user-\($0)" }
        let (hosts, clients, owner) = try threeHosts([7141, 7142, 7143], users: users, etcd: etcd, store: store)
        // Users of b have data the release's migration fails on; nobody else has.
        let onB = users.filter { owner[$0] == 1 }
        for user in users {
            let titles = onB.contains(user) ? ["dup", "dup"] : ["x", "y"]
            for title in titles {
                _ = try clients[owner[user]!].call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title) VALUES (?)", "parameters": [.string(title)]])
            }
        }
        // One release, the same on every host.
        try startRelease("0007_unique_titles.sql", "CREATE UNIQUE INDEX notes_title ON notes (title);", on: hosts, clients)

        // b migrates its stores: they fail, b halts the release, and so do a and c.
        let onBBefore = try release(hosts[1])
        #expect(onBBefore["state"] == "running", "\(onBBefore)")
        let migrateB = try run([userstorectlPath, "migrate", "--all", "--parallel", "1", "--socket", hosts[1].socketPath])
        #expect(migrateB.status == 1, "\(migrateB.stdout)\(migrateB.stderr)")
        let (halted, seen) = try eventually(hosts, are: "halted")
        #expect(halted, "\(seen)")
        // c migrates nothing now; its stores are held at the version they have.
        let migrateC = try run([userstorectlPath, "migrate", "--all", "--json", "--socket", hosts[2].socketPath])
        #expect(migrateC.status == 0 && !migrateC.stdout.contains("\"state\":\"migrated\"") && migrateC.stdout.contains("\"state\":\"held\""), "\(migrateC.stdout)")
        let onC = users.first { owner[$0] == 2 }!
        #expect(try clients[2].call("io.userstore.Store.Open", ["user": .string(onC)])["schemaVersion"] == 6)
        // Resumed from c: running again everywhere.
        #expect(try run([userstorectlPath, "release", "resume", "--socket", hosts[2].socketPath]).status == 0)
        let (running, seenAfterResume) = try eventually(hosts, are: "running")
        #expect(running, "\(seenAfterResume)")
        for host in hosts { #expect(host.stop() == 0) }
    }

    /// No host knows every store: each reports its own at the version, and the release is
    /// complete on every host once all three have.
    @Test(.timeLimit(.minutes(10)))
    func aGoodReleaseCompletesOnAllThreeOnceEachHostMigratedItsStores() async throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let users = (0..<30).map { "user-\($0)" }
        let (hosts, clients, owner) = try threeHosts([7144, 7145, 7146], users: users, etcd: etcd, store: store)
        for user in users {
            _ = try clients[owner[user]!].call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title) VALUES ('x')"])
        }
        try startRelease("0007_titles.sql", "CREATE INDEX notes_by_title ON notes (title);", on: hosts, clients)
        // a and b migrate theirs; c's stores are still behind: running everywhere.
        for host in hosts.prefix(2) {
            let migrated = try run([userstorectlPath, "migrate", "--all", "--socket", host.socketPath])
            #expect(migrated.status == 0, "\(migrated.stdout)\(migrated.stderr)")
        }
        // Once a and b have reported done (their keys in etcd), the release still runs: c has not.
        let id = try #require(try release(hosts[0])["id"]?.stringValue)
        let etcdClient = EtcdClient(endpoints: etcd.endpoints)
        var reported: Set<String> = []
        let deadline = ContinuousClock.now + .seconds(30)
        while reported != ["a", "b"], ContinuousClock.now < deadline { // one etcd round trip between looks
            reported = Set(try await etcdClient.list(prefix: "/us/v1/release-done/\(id)/").map { String($0.key.split(separator: "/").last ?? "") })
        }
        #expect(reported == ["a", "b"])
        #expect(try states(hosts) == ["running", "running", "running"])
        // c migrates its own: complete on all three.
        let migrated = try run([userstorectlPath, "migrate", "--all", "--socket", hosts[2].socketPath])
        #expect(migrated.status == 0, "\(migrated.stdout)\(migrated.stderr)")
        let (complete, seen) = try eventually(hosts, are: "complete")
        #expect(complete, "\(seen)\n\(hosts[0].stderr.suffix(3000))")
        // a made every store before the buckets were spread: it counts, lists and migrates its
        // own only (in Status and the release's status), and says how many copies of the
        // others' it keeps.
        let mine = users.filter { owner[$0] == 0 }
        let status = try clients[0].call("io.userstore.Admin.Status")
        #expect(status["knownStores"] == .integer(Int64(mine.count)) && status["pendingStores"] == 0, "\(status)")
        #expect(status["otherHostsStores"] == .integer(Int64(users.count - mine.count)), "\(status)")
        let onA = try release(hosts[0])
        #expect(onA["knownStores"] == .integer(Int64(mine.count)) && onA["versions"] == .object(["7": .integer(Int64(mine.count))]), "\(onA)")
        let listed = try run([userstorectlPath, "list", "--json", "--socket", hosts[0].socketPath])
        #expect(listed.stdout.split(separator: "\n").count == mine.count, "\(listed.stdout)")
        for host in hosts { #expect(host.stop() == 0) }
    }
}
