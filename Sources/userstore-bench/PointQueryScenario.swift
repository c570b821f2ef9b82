import Foundation
import GRDB
import UserStoreClient
import UserStoreCore

/// Scenario 1: point queries against PostgreSQL and the machine's floor, one call at a time and pipelined.
struct PointQueryScenario: Scenario {
    let bench: Bench

    /// `SELECT value FROM kv WHERE id = ?` on 100 and on 1,000 users × 10,000 rows, driven by
    /// the C load generator like pgbench drives PostgreSQL (`-j 2`), alternating with pgbench
    /// and with the machine's floor (the same client against a server that answers every
    /// message with a constant reply, bench/userstore-floor.c) at each client count; then
    /// pipelined — in batches, as pgbench's pipeline mode sends them, and as a sliding window,
    /// as concurrent UserStoreClient calls arrive — with the Swift client, and in process.
    func run() async throws {
        let postgres = Postgres.available() ? Postgres(directory: env.root + "/postgres") : nil
        postgres?.start()
        defer { postgres?.stop() }
        for userCount in quick ? [100] : [100, 1000] {
            try await pointQueries(users: userCount, postgres: postgres)
        }
        try await metricsCost()
        try await watchCost()
    }

    /// What the change stream costs a read: 8-client point queries on 100 users with
    /// `watch.enabled` false and true, alternating, on the same files.
    private func watchCost() async throws {
        guard let load else { return }
        log("1. point query: watch off and on")
        let data = env.root + "/point100-data", migrations = env.root + "/point100-migrations"
        let workload = LoadGenerator.Workload(users: 100)
        try await alternating(scenario: "1. point query, watch", subject: { "userstored, 8 connections, 100 users, watch.enabled \($0)" + ($0 ? ", no watcher" : "") }) { on in
            let (daemon, socket) = try env.startDaemon(name: "watch-\(on)", data: data, migrations: migrations, extra: "watch:\n  enabled: \(on)")
            defer { env.stop(daemon) }
            await warm(socket: socket, users: users(100), load: load, workload: workload)
            return load.run(socket: socket, connections: 8, seconds: seconds, workload)
        }
    }

    /// Every store open and every page in its cache (``scan(socket:users:)``), as pgbench's table
    /// sits in shared buffers; then a short run.
    func warm(socket: String, users: [String], load: LoadGenerator, workload: LoadGenerator.Workload) async {
        await scan(socket: socket, users: users)
        _ = load.run(socket: socket, connections: 8, seconds: min(seconds, 2), workload)
    }

    /// Every page of every store in its cache: one full scan each. Before each measured run of
    /// the daemon that follows a pause: it hands back the caches of stores idle for
    /// `cacheIdleSeconds` (1 s by default), and it sat idle while PostgreSQL and the floor ran,
    /// which are measured warm, as is SQLite alone — measured cold, the daemon's first seconds
    /// went on reading 1,000 stores' pages back from the file.
    func scan(socket: String, users: [String]) async {
        _ = try? await UserStoreClient.withClient(socketPath: socket) { client in
            for user in users { _ = try? await client.store(for: user).query("SELECT sum(length(value)) FROM kv") }
        }
    }

    /// The cost of metrics: 8-client point queries on 100 users with metrics off and on,
    /// alternating, on the same files.
    private func metricsCost() async throws {
        guard let load else { return }
        log("1. point query: metrics off and on")
        let data = env.root + "/point100-data", migrations = env.root + "/point100-migrations"
        let workload = LoadGenerator.Workload(users: 100)
        let cost = { (off: Double, on: Double) in 100 * (off - on) / max(off, 1) }
        let (off, on) = try await alternating(scenario: "1. point query, metrics", subject: { "userstored, 8 connections, 100 users, metrics \($0 ? "on" : "off")" },
                                        note: { String(format: "cost %.1f%%", cost($0, $1)) }) { metrics in
            let (daemon, socket) = try env.startDaemon(name: "metrics-\(metrics)", data: data, migrations: migrations, metrics: metrics)
            defer { env.stop(daemon) }
            await warm(socket: socket, users: users(100), load: load, workload: workload)
            return load.run(socket: socket, connections: 8, seconds: seconds, workload)
        }
        check(TargetCheck(target: "metrics cost ≤ 3% of point-query throughput", measured: String(format: "%.1f%%", cost(off, on)), met: cost(off, on) <= 3))
    }

    private func pointQueries(users userCount: Int, postgres: Postgres?) async throws {
        let scenario = "1. point query, \(userCount) users"
        log("\(scenario): preparing \(userCount) users x 10,000 rows")
        let fleet = try await kvFleet(name: "point\(userCount)", count: userCount, rows: 10_000)
        let (daemon, socket) = try env.startDaemon(name: "point\(userCount)", data: fleet.data, migrations: fleet.migrations)
        let workload = LoadGenerator.Workload(users: userCount)
        guard let load else {
            record(Measurement(scenario: scenario, subject: "userstored", value: 0, unit: "req/s", note: "userstore-load not built"))
            return
        }
        await warm(socket: socket, users: fleet.users, load: load, workload: workload)
        let floor = env.startFloorServer()
        defer { if let floor { env.stopFloorServer(floor.pid) } }
        var postgresAt8: Double?
        var floorRates: [Int: Double] = [:]
        for clients in [1, 8, 64] {
            // The first run follows the warm-up; the others a pause (PostgreSQL, the floor).
            if clients > 1 { await scan(socket: socket, users: fleet.users) }
            let (ours, daemonCPU) = withCPU(of: daemon.processIdentifier) { load.run(socket: socket, connections: clients, seconds: seconds, workload) }
            record(Measurement(scenario: scenario, subject: "userstored, C client, \(clients) connection\(clients == 1 ? "" : "s")",
                               value: ours.throughput, unit: "req/s", p50: ours.p50, p99: ours.p99,
                               note: "daemon CPU \(format(daemonCPU)) µs/request, client CPU \(format(ours.clientCPU)) µs/request" + errors(ours.errors)))
            if clients <= 8 {
                await compareClientLibrary(connections: clients, socket: socket, users: fleet.users, load: load, workload: workload, scenario: scenario)
            }
            if clients == 8 {
                check(TargetCheck(target: "p99 < 500 µs at 8 clients (\(userCount) users)", measured: "\(format(ours.p99)) µs", met: ours.p99 < 500))
                check(TargetCheck(target: "daemon CPU ≤ 20 µs per point query at 8 clients (\(userCount) users)", measured: "\(format(daemonCPU)) µs", met: daemonCPU <= 20))
            }
            var postgresRate: Double?
            if let postgres {
                let (tps, latencies) = postgres.pgbench("-S", clients: clients, seconds: Int(seconds.rounded(.up)))
                postgresRate = tps
                if clients == 8 { postgresAt8 = tps }
                let ratio = ours.throughput / max(tps, 1)
                record(Measurement(scenario: scenario, subject: "PostgreSQL 15 pgbench -S -M prepared -j 2, \(clients) client\(clients == 1 ? "" : "s")",
                                   value: tps, unit: "tps", p50: latencies.percentile(0.5), p99: latencies.percentile(0.99),
                                   note: String(format: "userstored / PostgreSQL = %.2f×", ratio)))
                check(TargetCheck(target: "point queries ≥ 1.0× PostgreSQL at \(clients) client\(clients == 1 ? "" : "s") (\(userCount) users)",
                                  measured: String(format: "%.2f×", ratio), met: ratio >= 1.0))
            }
            if let floor {
                let limit = load.run(socket: floor.socket, connections: clients, seconds: seconds, workload)
                let share = ours.throughput / max(limit.throughput, 1)
                floorRates[clients] = limit.throughput
                var note = String(format: "the machine's floor: userstored reaches %.2f of it", share)
                if let postgresRate { note += String(format: ", PostgreSQL %.2f", postgresRate / max(limit.throughput, 1)) }
                record(Measurement(scenario: scenario, subject: "constant-reply server (bench/userstore-floor.c), C client, \(clients) connection\(clients == 1 ? "" : "s")",
                                   value: limit.throughput, unit: "req/s", p50: limit.p50, p99: limit.p99, note: note + errors(limit.errors)))
                if clients > 1 {
                    check(TargetCheck(target: "point queries ≥ 0.9 of the floor at \(clients) clients (\(userCount) users)",
                                      measured: String(format: "%.2f", share), met: share >= 0.9))
                }
            }
        }

        // Pipelined in batches, as pgbench's pipeline mode: 16 calls in one write on each of 8
        // connections, the next batch once all 16 replies are in.
        await scan(socket: socket, users: fleet.users)
        let (batched, batchCPU) = withCPU(of: daemon.processIdentifier) {
            load.run(socket: socket, connections: 8, pipeline: 16, seconds: seconds, extra: ["--batch", "1"], workload)
        }
        record(Measurement(scenario: scenario, subject: "userstored, C client, 8 connections × batches of 16 (as pgbench's pipeline mode)",
                           value: batched.throughput, unit: "req/s", p50: batched.p50, p99: batched.p99,
                           note: "daemon CPU \(format(batchCPU)) µs/request" + errors(batched.errors)))
        // The same batches against the constant-reply server: the kernel's and the client's part.
        var batchFloor: Double?
        if let floor {
            let limit = load.run(socket: floor.socket, connections: 8, pipeline: 16, seconds: seconds, extra: ["--batch", "1"], workload)
            batchFloor = limit.throughput
            record(Measurement(scenario: scenario, subject: "constant-reply server (bench/userstore-floor.c), C client, 8 connections × batches of 16",
                               value: limit.throughput, unit: "req/s", p50: limit.p50, p99: limit.p99,
                               note: String(format: "the machine's floor for batches: userstored reaches %.2f of it", batched.throughput / max(limit.throughput, 1))
                                   + "; client CPU \(format(limit.clientCPU)) µs/request" + errors(limit.errors)))
        }

        // Pipelined as a sliding window: 16 calls in flight on each of 8 connections, each slot
        // refilled as its reply arrives (what many concurrent UserStoreClient calls produce).
        await scan(socket: socket, users: fleet.users)
        let (pipelined, pipelinedCPU) = withCPU(of: daemon.processIdentifier) { load.run(socket: socket, connections: 8, pipeline: 16, seconds: seconds, workload) }
        var note = "daemon CPU \(format(pipelinedCPU)) µs/request" + errors(pipelined.errors)
        if let postgresAt8 {
            let ratio = pipelined.throughput / max(postgresAt8, 1)
            note += String(format: "; %.2f× pgbench -S at 8 clients", ratio)
            check(TargetCheck(target: "pipelined point queries ≥ 2× PostgreSQL at 8 connections (\(userCount) users)",
                              measured: String(format: "%.2f×", ratio), met: ratio >= 2))
        }
        record(Measurement(scenario: scenario, subject: "userstored, C client, 8 connections × 16 pipelined (sliding window)",
                           value: pipelined.throughput, unit: "req/s", p50: pipelined.p50, p99: pipelined.p99, note: note))
        var pipelineQueries: Double?
        if let postgres {
            let queries = postgres.pipelined(clients: 8, seconds: Int(seconds.rounded(.up)))
            pipelineQueries = queries
            let ratio = batched.throughput / max(queries, 1)
            record(Measurement(scenario: scenario, subject: "PostgreSQL 15 pgbench pipeline mode, 8 clients × 16 queries",
                               value: queries, unit: "queries/s",
                               note: String(format: "userstored in batches / PostgreSQL pipelined = %.2f× (sliding window: %.2f×)",
                                            ratio, pipelined.throughput / max(queries, 1))))
            let wanted = userCount <= 100 ? 1.3 : 1.2
            check(TargetCheck(target: String(format: "pipelined batches ≥ %.1f× pgbench's pipeline mode (%d users)", wanted, userCount),
                              measured: String(format: "%.2f×", ratio), met: ratio >= wanted))
        }

        env.stop(daemon)
        if let pipelineQueries, let batchFloor {
            sqliteAlone(scenario: scenario, users: fleet.users, data: fleet.data, batchFloor: batchFloor, floors: floorRates,
                        postgres: pipelineQueries, userCount: userCount)
        }

        // In-process GRDB on the same files: what SQLite itself costs (no socket, no JSON).
        guard userCount == (quick ? 100 : 1000) else { return }
        let layout = StoreLayout(dataDirectory: fleet.data)
        let queues = try fleet.users.map { try DatabaseQueue(path: layout.storePath(for: try UserID($0))) }
        for queue in queues { _ = try queue.inDatabase { db in try Int.fetchOne(db, sql: "SELECT sum(length(value)) FROM kv") } } // warm, as above
        for threads in [1, 8] {
            let result = runLoad(threads: threads, seconds: seconds) { index in
                let box = RandomBox(FastRandom(state: UInt64(index + 1) * 104_729))
                return {
                    let queue = queues[box.below(queues.count)]
                    return (try? queue.inDatabase { db in try String.fetchOne(db.cachedStatement(sql: Bench.pointQuery), arguments: [box.below(10_000) + 1]) }) != nil
                }
            }
            record(Measurement(scenario: scenario, subject: "in-process GRDB, \(threads) thread\(threads == 1 ? "" : "s")",
                               value: result.throughput, unit: "req/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99),
                               note: "what SQLite itself costs: no socket, no JSON"))
        }
        for queue in queues { try? queue.close() }
    }

    /// SQLite alone on the files userstored just served (bench/userstore-sqlite-floor.c: the
    /// point query from C, two threads, no socket, no JSON), and with it the most any server
    /// that runs one SQLite query per request on these files could reach here in batches: each
    /// request costs at least SQLite's CPU plus the kernel's and the client's (the constant-reply
    /// server's batches), on the same two cores. The same sum for one call at a time at 8 and
    /// 64 connections (`floors`: the constant-reply server's rates) says what share of the
    /// floor such a server could reach there.
    private func sqliteAlone(scenario: String, users: [String], data: String, batchFloor: Double, floors: [Int: Double],
                             postgres: Double, userCount: Int) {
        let binary = env.binaries + "/userstore-sqlite-floor", list = env.root + "/sqlite-floor-\(userCount)"
        guard FileManager.default.isExecutableFile(atPath: binary) else { return }
        let layout = StoreLayout(dataDirectory: data)
        let paths = users.compactMap { try? layout.storePath(for: UserID($0)) }
        guard (try? paths.joined(separator: "\n").write(toFile: list, atomically: true, encoding: .utf8)) != nil else { return }
        let (status, output) = shell("'\(binary)' --files '\(list)' --threads 2 --seconds \(seconds)")
        guard status == 0, let line = output.split(separator: "\n").last,
              let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
              let alone = (object["throughput"] as? NSNumber)?.doubleValue, alone > 0 else {
            log("userstore-sqlite-floor failed (\(status)): \(output)")
            return
        }
        let cpu = (object["cpu_us"] as? NSNumber)?.doubleValue ?? 0
        record(Measurement(scenario: scenario, subject: "SQLite alone: the point query from C on the same files, 2 threads (bench/userstore-sqlite-floor.c)",
                           value: alone, unit: "queries/s",
                           note: "\(format(cpu)) µs of CPU per query; " + String(format: "%.2f× pgbench's pipeline mode", alone / max(postgres, 1))))
        let bound = 1 / (1 / alone + 1 / batchFloor)
        let wanted = userCount <= 100 ? 1.3 : 1.2
        record(Measurement(scenario: scenario, subject: "the most a server running one SQLite query per request could reach in batches here (SQLite alone + the batch floor)",
                           value: bound, unit: "req/s",
                           note: String(format: "%.2f× pgbench's pipeline mode; the target asks %.1f×", bound / max(postgres, 1), wanted)))
        // One call at a time the two cores are as busy (client and server both CPU-bound), so a
        // server that adds SQLite's CPU per request to the floor's cannot pass this either.
        for clients in [8, 64] {
            guard let floor = floors[clients] else { continue }
            let bound = 1 / (1 / alone + 1 / floor)
            record(Measurement(scenario: scenario, subject: "the most a server running one SQLite query per request could reach at \(clients) connections here (SQLite alone + the floor)",
                               value: bound, unit: "req/s",
                               note: String(format: "%.2f of the floor; the target asks 0.9", bound / floor)))
        }
    }
}
