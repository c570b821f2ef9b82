import Foundation
import UserStoreClient
import Varlink

/// Scenario 7: durable writes with replication on, to a folder.
struct ReplicationScenario: Scenario {
    let bench: Bench

    /// Durable INSERTs with replication off, on, and on with durable writes (each reply waits
    /// for the log object holding the transaction in a `file://` replica on the same disk),
    /// from the C client.
    func run() async throws {
        log("7. replication")
        let fleet = try await kvFleet(name: "replicated", count: 8, rows: 0)
        let insert = "INSERT INTO kv (value) VALUES ('durable write')"
        let modes: [(name: String, config: String)] = [
            ("replication off", ""),
            ("replication on", "replication:\n  replica: file://\(env.root)/replica"),
            ("replication on, durableWrites", "replication:\n  replica: file://\(env.root)/replica\n  durableWrites: true"),
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
    }
}
