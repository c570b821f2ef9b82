import Foundation
import GRDB
import UserStoreCore

/// Scenario 2: durable single-row writes through the daemon against in-process GRDB.
struct DurableWriteScenario: Scenario {
    let bench: Bench

    /// Single-row INSERTs in autocommit (WAL, `synchronous=FULL`), one user and eight users
    /// (a connection each), against in-process GRDB with the daemon's connection settings.
    func run() async throws {
        log("2. durable writes")
        let fleet = try await kvFleet(name: "writes", count: 8, rows: 0)
        let (daemon, socket) = try env.startDaemon(name: "writes", data: fleet.data, migrations: fleet.migrations)
        let insert = "INSERT INTO kv (value) VALUES ('durable write')"
        var daemonRates: [Int: Double] = [:]
        for users in [1, 8] {
            guard let load else { break }
            let (result, daemonCPU) = withCPU(of: daemon.processIdentifier) {
                load.run(socket: socket, connections: users, seconds: seconds,
                         LoadGenerator.Workload(method: "io.userstore.Store.Execute", sql: insert, rows: 0, users: 8, userPerConnection: true))
            }
            daemonRates[users] = result.throughput
            record(Measurement(scenario: "2. durable INSERT", subject: "userstored, C client, \(users == 1 ? "1 user" : "\(users) users, a connection each")",
                               value: result.throughput, unit: "req/s", p50: result.p50, p99: result.p99,
                               note: "daemon CPU \(format(daemonCPU)) µs/request" + errors(result.errors)))
        }
        env.stop(daemon)
        await watchCost(fleet: fleet, insert: insert)
        let layout = StoreLayout(dataDirectory: fleet.data)
        for threads in [1, 8] {
            let queues = try (0..<threads).map { index -> DatabaseQueue in
                var config = Configuration()
                config.prepareDatabase { db in
                    // The daemon's own connection settings (StoreOpener).
                    try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE")
                    try db.execute(sql: "PRAGMA synchronous = FULL")
                }
                return try DatabaseQueue(path: layout.storePath(for: try UserID(fleet.users[index])), configuration: config)
            }
            let result = runLoad(threads: threads, seconds: seconds) { index in
                { (try? queues[index].inDatabase { try $0.execute(sql: insert) }) != nil }
            }
            let share = (daemonRates[threads] ?? 0) / max(result.throughput, 1)
            record(Measurement(scenario: "2. durable INSERT", subject: "in-process GRDB (WAL, synchronous=FULL, exclusive locking), \(threads) thread\(threads == 1 ? "" : "s")",
                               value: result.throughput, unit: "ops/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99),
                               note: String(format: "userstored reaches %.0f%% of it", 100 * share)))
            if threads == 8 {
                check(TargetCheck(target: "durable INSERTs ≥ 80% of in-process GRDB at 8 users", measured: String(format: "%.0f%%", 100 * share), met: share >= 0.8))
            }
            for queue in queues { try? queue.close() }
        }
    }

    /// What recording changes for watchers costs a writer nobody watches: 8 users' durable
    /// INSERTs with `watch.enabled` false and true, alternating (off, on, off, on); then on,
    /// with a watcher on each store that never reads (dropped with WatchTooSlow once
    /// `watch.maxBufferedBytes` wait), against none, alternating: a slow watcher must not slow
    /// the writers.
    private func watchCost(fleet: (data: String, migrations: String, users: [String]), insert: String) async {
        guard let load else { return }
        let workload = LoadGenerator.Workload(method: "io.userstore.Store.Execute", sql: insert, rows: 0, users: 8, userPerConnection: true)
        await alternating(scenario: "2. durable INSERT, watch", subject: { "userstored, 8 users, watch.enabled \($0)" + ($0 ? ", no watcher" : "") }) { on in
            guard let (daemon, socket) = try? env.startDaemon(name: "writes-watch-\(on)", data: fleet.data, migrations: fleet.migrations,
                                                              extra: "watch:\n  enabled: \(on)") else { return nil }
            defer { env.stop(daemon) }
            return load.run(socket: socket, connections: 8, seconds: seconds, workload)
        }
        // Every store watched once first, so that both sides record (a store records from its
        // first watch on): what differs is only the watcher that never reads.
        if let (daemon, socket) = try? env.startDaemon(name: "writes-stuck-start", data: fleet.data, migrations: fleet.migrations) {
            Self.stuckWatchers(socket: socket, users: fleet.users)?.terminate()
            env.stop(daemon)
        }
        await alternating(scenario: "2. durable INSERT, watch",
                          subject: { "userstored, 8 users, stores recording, " + ($0 ? "a watcher on each that never reads" : "no watcher") }) { watched in
            guard let (daemon, socket) = try? env.startDaemon(name: "writes-stuck-\(watched)", data: fleet.data, migrations: fleet.migrations,
                                                              extra: "watch:\n  enabled: true\n  maxBufferedBytes: 65536") else { return nil }
            defer { env.stop(daemon) }
            let watchers = watched ? Self.stuckWatchers(socket: socket, users: fleet.users) : nil
            defer { watchers?.terminate() }
            return load.run(socket: socket, connections: 8, seconds: seconds, workload)
        }
    }

    /// A process holding a Watch (values on) on each of `users`' stores that never reads a reply.
    static func stuckWatchers(socket: String, users: [String]) -> Process? {
        let script = """
            import json, socket, sys, time
            held = []
            for user in sys.argv[2:]:
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
                s.sendall(json.dumps({"method": "io.userstore.Store.Watch", "parameters": {"user": user, "values": True}, "more": True}).encode() + b"\\0")
                held.append(s)
            print("watching", flush=True)
            time.sleep(3600)
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script, socket] + users
        let output = Pipe()
        process.standardOutput = output
        guard (try? process.run()) != nil else { return nil }
        _ = output.fileHandleForReading.availableData // "watching": every watch sent
        return process
    }
}
