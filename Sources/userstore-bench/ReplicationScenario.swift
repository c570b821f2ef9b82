import Foundation
import UserStoreClient
import Varlink

/// Scenario 7: durable writes with replication on, and the memory of registered stores.
struct ReplicationScenario: Scenario {
    let bench: Bench

    /// Durable INSERTs with replication off, on, and on with durable writes (each reply waits
    /// for Litestream to confirm the transaction in a `file://` replica on the same disk), from
    /// the C client; then Litestream's memory per registered store.
    func run() async throws {
        log("7. replication")
        let litestream = env.repository + "/.build/testenv/bin/litestream"
        guard FileManager.default.isExecutableFile(atPath: litestream) else {
            log("7. replication skipped: \(litestream) missing (scripts/install-deps.sh installs it)")
            return
        }
        let fleet = try await kvFleet(name: "replicated", count: 8, rows: 0)
        let insert = "INSERT INTO kv (value) VALUES ('durable write')"
        let modes: [(name: String, config: String)] = [
            ("replication off", ""),
            ("replication on", "replication:\n  replica: file://\(env.root)/replica\n  litestream: \(litestream)"),
            ("replication on, durableWrites", "replication:\n  replica: file://\(env.root)/replica\n  litestream: \(litestream)\n  durableWrites: true"),
        ]
        var baseline: [Int: Double] = [:]
        for (index, mode) in modes.enumerated() {
            guard let load else { break }
            let (daemon, socket) = try env.startDaemon(name: "replicated-\(index)", data: fleet.data, migrations: fleet.migrations, extra: mode.config)
            for users in [1, 8] {
                let (result, daemonCPU) = withCPU(of: daemon.processIdentifier) {
                    load.run(socket: socket, connections: users, seconds: seconds,
                             LoadGenerator.Workload(method: "io.userstore.Store.Execute", sql: insert, rows: 0, users: 8, userPerConnection: true))
                }
                if index == 0 { baseline[users] = result.throughput }
                let ratio = index == 0 ? "" : String(format: "; %.2f× replication off", result.throughput / max(baseline[users] ?? 1, 1))
                record(Measurement(scenario: "7. replication", subject: "durable INSERT, \(mode.name), \(users == 1 ? "1 user" : "\(users) users, a connection each")",
                                   value: result.throughput, unit: "req/s", p50: result.p50, p99: result.p99,
                                   note: "daemon CPU \(format(daemonCPU)) µs/request\(ratio)" + errors(result.errors)))
            }
            env.stop(daemon)
        }
        try await registeredStoreMemory(litestream: litestream)
    }

    /// Litestream's resident memory and descriptors with N stores registered (N opened through
    /// the daemon), against Litestream with none.
    private func registeredStoreMemory(litestream: String) async throws {
        let count = quick ? 200 : 1000
        let fleet = try await kvFleet(name: "registered", count: count, rows: 0)
        let config = "replication:\n  replica: file://\(env.root)/replica-memory\n  litestream: \(litestream)\n  maxRegisteredStores: \(count)"
        let (daemon, socket) = try env.startDaemon(name: "registered", data: fleet.data, migrations: fleet.migrations, maxOpenStores: count, extra: config)
        let client = UserStoreClient(socketPath: socket)
        func litestreamStatus() async -> (pid: Int32, registered: Int64) {
            let status = (try? await client.call("io.userstore.Admin.Status"))?["replication"]
            return (Int32(status?["litestreamPid"]?.integerValue ?? 0), status?["registeredStores"]?.integerValue ?? 0)
        }
        let (pid, _) = await litestreamStatus()
        let idleRSS = residentMiB(of: pid)
        var failures = 0
        for user in fleet.users where (try? await client.store(for: user).open()) == nil { failures += 1 }
        // Litestream opens a registered database on its first sync (within a second): one write each.
        for user in fleet.users {
            let parameters: [String: JSONValue] = ["user": .string(user), "sql": "INSERT INTO kv (value) VALUES ('x')", "durable": true]
            if (try? await client.call("io.userstore.Store.Execute", parameters)) == nil { failures += 1 }
        }
        let (_, registered) = await litestreamStatus()
        let rss = residentMiB(of: pid)
        let fds = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).count
        await client.shutdown()
        env.stop(daemon)
        let perStore = (rss - idleRSS) * 1024 / Double(max(registered, 1))
        record(Measurement(scenario: "7. replication", subject: "Litestream memory with \(registered) stores registered", value: rss, unit: "MiB",
                           note: "\(format(perStore)) KiB and \(format(Double(fds) / Double(max(registered, 1)))) fds per registered store (\(format(idleRSS)) MiB with none)" + errors(failures)))
    }

    private func residentMiB(of pid: Int32) -> Double {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
        return (line.flatMap { Double($0.split(separator: " ").dropFirst().first ?? "") } ?? 0) / 1024
    }
}
