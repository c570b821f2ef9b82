import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
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

    @Test(.timeLimit(.minutes(10)))
    func aHaltOnOneHostStopsTheRolloutOnAllThree() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try ClusterDaemonTests.objectStore()
        let hosts = try [("a", 7141), ("b", 7142), ("c", 7143)].map { try Self.daemon($0.0, port: $0.1, etcd: etcd, store: store) }
        for host in hosts { try host.start() }
        let clients = try hosts.map { try $0.connect() }
        let users = (0..<60).map { "user-\($0)" }
        // a took every bucket; the controller spreads them over the three.
        #expect(ClusterDaemonTests.eventually { users.allSatisfy { ClusterDaemonTests.answer(clients[0], $0).0 != "io.userstore.Store.ClusterUnavailable" } })
        _ = try clients[0].call("io.userstore.Admin.Rebalance")
        var owner: [String: Int] = [:]
        #expect(try ClusterDaemonTests.eventually {
            owner = [:]
            for user in users {
                for (index, client) in clients.enumerated() where ClusterDaemonTests.answer(client, user).0 == "here" { owner[user] = index }
            }
            return owner.count == users.count && Set(owner.values).count == 3
        }, "\(owner)")
        // Users of b have data the release's migration fails on; nobody else has.
        let onB = users.filter { owner[$0] == 1 }
        for user in users {
            let titles = onB.contains(user) ? ["dup", "dup"] : ["x", "y"]
            for title in titles {
                _ = try clients[owner[user]!].call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title) VALUES (?)", "parameters": [.string(title)]])
            }
        }
        for (index, host) in hosts.enumerated() {
            try host.addMigration("0007_unique_titles.sql", "CREATE UNIQUE INDEX notes_title ON notes (title);")
            _ = try clients[index].call("io.userstore.Admin.Reload")
        }
        // One release, the same on every host.
        var ids: Set<String> = []
        #expect(try ClusterDaemonTests.eventually {
            ids = Set(try hosts.map { try release($0)["id"]?.stringValue ?? "" })
            return ids.count == 1 && !ids.contains("")
        }, "\(ids)")
        let first = try release(hosts[0])
        #expect(first["state"] == "running", "\(first)\n\(hosts[0].stderr.suffix(4000))\n\(hosts[1].stderr.suffix(4000))")

        // b migrates its stores: they fail, b halts the release, and so do a and c.
        let onBBefore = try release(hosts[1])
        #expect(onBBefore["state"] == "running", "\(onBBefore)")
        let migrateB = try run([userstorectlPath, "migrate", "--all", "--parallel", "1", "--socket", hosts[1].socketPath])
        #expect(migrateB.status == 1, "\(migrateB.stdout)\(migrateB.stderr)")
        var states: [String] = []
        #expect(try ClusterDaemonTests.eventually {
            states = try hosts.map { try release($0)["state"]?.stringValue ?? "?" }
            return states == ["halted", "halted", "halted"]
        }, "\(states)")
        // c migrates nothing now; its stores are held at the version they have.
        let migrateC = try run([userstorectlPath, "migrate", "--all", "--json", "--socket", hosts[2].socketPath])
        #expect(migrateC.status == 0 && !migrateC.stdout.contains("\"state\":\"migrated\"") && migrateC.stdout.contains("\"state\":\"held\""), "\(migrateC.stdout)")
        let onC = users.first { owner[$0] == 2 }!
        #expect(try clients[2].call("io.userstore.Store.Open", ["user": .string(onC)])["schemaVersion"] == 6)
        // Resumed from c: running again everywhere.
        #expect(try run([userstorectlPath, "release", "resume", "--socket", hosts[2].socketPath]).status == 0)
        #expect(try ClusterDaemonTests.eventually { try hosts.allSatisfy { try release($0)["state"] == "running" } })
        for host in hosts { #expect(host.stop() == 0) }
    }
}
