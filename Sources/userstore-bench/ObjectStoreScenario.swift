import AsyncHTTPClient
import Foundation
import UserStoreClient
import UserStoreS3

/// Scenario 8: replication to an S3 object store, and what a reopen costs with it.
struct ObjectStoreScenario: Scenario {
    let bench: Bench

    /// The log objects the daemon on `socket` wrote since it started (nil: not the log engine).
    func objectsWritten(_ socket: String) async throws -> Int64? {
        let client = UserStoreClient(socketPath: socket)
        try await client.connect()
        let status = try? await client.call("io.userstore.Admin.Status")
        await client.shutdown()
        return status?["replication"]?["log"]?["objectsWritten"]?.integerValue
    }

    /// The S3 requests SeaweedFS on `port` counted for the bucket `userstore` since it started —
    /// every request of the daemon's (log objects, the writer lease's reads and renewals, fences,
    /// the fold), counted by the server, not by the daemon: its own Prometheus counters, on the
    /// port scripts/s3.sh gives them (the S3 port + 8).
    func bucketRequests(port: Int) async throws -> Double {
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: "http://127.0.0.1:\(port + 8)/metrics"), timeout: .seconds(10))
        let text = String(buffer: try await response.body.collect(upTo: 16 << 20))
        return text.split(separator: "\n").reduce(0) { total, line in
            guard line.hasPrefix("SeaweedFS_s3_request_total{"), line.contains("bucket=\"userstore\""),
                  let value = line.split(separator: " ").last.flatMap({ Double($0) }) else { return total }
            return total + value
        }
    }

    /// What replication to a bucket costs per new user and per durable write (issue #38), side by
    /// side with replication off in the same run: SeaweedFS (scripts/s3.sh, its own port) over
    /// its S3 API on loopback; the daemon's own log; the C client drives the writes. (Litestream's
    /// figures, from before it was retired, are in docs/bench/hostlog-s3-2026-11-28.json.)
    func run() async throws {
        log("8. replication on S3")
        let port = 8433
        let s3 = "USERSTORE_S3_PORT=\(port) bash '\(env.repository)/scripts/s3.sh'"
        guard shell("\(s3) start").0 == 0 else {
            log("8. skipped: SeaweedFS missing (scripts/install-deps.sh installs it)")
            return
        }
        defer { _ = shell("\(s3) stop") }
        // The daemon reads the bucket's credentials from its environment (inherited).
        setenv("AWS_ACCESS_KEY_ID", "userstore-dev", 1)
        setenv("AWS_SECRET_ACCESS_KEY", "userstore-dev-secret", 1)
        // Each mode its own prefix, so that leases and markers are apart; the reopen measurement
        // another (the users' names repeat).
        let pid = getpid()
        func replica(_ prefix: String) -> String {
            "s3://userstore/\(prefix)?endpoint=http://127.0.0.1:\(port)&region=us-east-1&forcePathStyle=true"
        }
        let modes: [(name: String, prefix: String?, settings: String)] = [
            ("replication off", nil, ""),
            // The daemon's own log with its defaults, then other batch times: fewer objects per
            // write, for what latency.
            ("host log on S3, durableWrites", "bench-\(pid)-log", "  durableWrites: true"),
            ("host log on S3, durableWrites, batchMilliseconds 0", "bench-\(pid)-log0", "  durableWrites: true\n  batchMilliseconds: 0"),
            ("host log on S3, durableWrites, batchMilliseconds 20", "bench-\(pid)-log20", "  durableWrites: true\n  batchMilliseconds: 20"),
        ]
        func config(_ index: Int, reopen: Bool = false) -> String {
            guard let prefix = modes[index].prefix else { return "" }
            return "replication:\n  replica: \"\(replica(prefix + (reopen ? "-reopen" : "")))\"\n" + modes[index].settings
        }
        // The floor: one PUT of a log object's size (4 KiB, one page and its framing), one at a
        // time, on the same SeaweedFS in the same run.
        let floor = try await putFloor(endpoint: "http://127.0.0.1:\(port)")
        record(Measurement(scenario: "8. replication on S3", subject: "one PUT of 4 KiB (the floor)", value: Double(floor.samples.count) / (Double(floor.samples.reduce(0, +)) / 1e9),
                           unit: "PUT/s", p50: floor.percentile(0.5), p99: floor.percentile(0.99), note: ""))
        var newStoreP50: [Double] = [], reopenP50: [Double] = [], durable: [String: LoadGenerator.Result] = [:]
        var requestsPerWrite: Double?
        for (index, mode) in modes.enumerated() {
            let fleet = try await kvFleet(name: "s3-\(index)", count: 8, rows: 0)
            let (daemon, socket) = try env.startDaemon(name: "s3-\(index)", data: fleet.data, migrations: fleet.migrations, extra: config(index))
            defer { env.stop(daemon) }
            // New users, one at a time: the lookup in the replica, the store, its migration, its
            // base in the log.
            let client = UserStoreClient(socketPath: socket)
            try await client.connect()
            var samples: [UInt64] = [], failures = 0
            for user in 0..<(quick ? 100 : 300) {
                let before = nanoseconds()
                if (try? await client.store(for: "new\(index)-\(user)").open()) == nil { failures += 1 }
                samples.append(nanoseconds() - before)
            }
            await client.shutdown()
            let latencies = Latencies(samples: samples)
            newStoreP50.append(latencies.percentile(0.5))
            reopenP50.append(try await reopenCost(mode: mode.name, index: index, config: config(index, reopen: true), baselineP50: reopenP50.first,
                                                  bucketPrefix: mode.prefix.map { $0 + "-reopen/" }, s3Endpoint: "http://127.0.0.1:\(port)"))
            let ratio = index == 0 ? "" : String(format: "%.2f× replication off (p50)", latencies.percentile(0.5) / max(newStoreP50[0], 1))
            record(Measurement(scenario: "8. replication on S3", subject: "new store (lookup, create, migrate, register), \(mode.name)",
                               value: Double(samples.count) / (Double(samples.reduce(0, +)) / 1e9), unit: "stores/s",
                               p50: latencies.percentile(0.5), p99: latencies.percentile(0.99), note: ratio + errors(failures)))
            // Durable INSERTs: 8 writers on 8 stores, then 64 writers on 64 stores (the 56 more
            // are created by their first write).
            guard let load else { continue }
            for writers in [8, 64] {
                let objectsBefore = try await objectsWritten(socket)
                let requestsBefore = try await bucketRequests(port: port)
                let result = load.run(socket: socket, connections: writers, seconds: seconds,
                                      LoadGenerator.Workload(method: "io.userstore.Store.Execute", sql: "INSERT INTO kv (value) VALUES ('durable write')",
                                                             rows: 0, users: writers, userPerConnection: true))
                durable["\(index)-\(writers)"] = result
                var note = index == 0 ? "" : String(format: "%.2f× replication off", result.throughput / max(durable["0-\(writers)"]?.throughput ?? 1, 1))
                if writers == 64, let eight = durable["\(index)-8"] {
                    note += String(format: "%@%.1f× the 8 writers' throughput", note.isEmpty ? "" : "; ", result.throughput / max(eight.throughput, 1))
                }
                if index > 0 {
                    note += String(format: "; p50 %.2f×, p99 %.2f× one PUT's", result.p50 / max(floor.percentile(0.5), 1), result.p99 / max(floor.percentile(0.99), 1))
                }
                if let before = objectsBefore, let after = try await objectsWritten(socket), result.requests > 0 {
                    let requests = (try await bucketRequests(port: port) - requestsBefore) / Double(result.requests)
                    note += String(format: "; %.3f log objects and %.3f S3 requests (SeaweedFS's count) per write",
                                   Double(after - before) / Double(result.requests), requests)
                    if index == 1 && writers == 64 { requestsPerWrite = requests }
                }
                record(Measurement(scenario: "8. replication on S3", subject: "INSERT, \(mode.name), \(writers) writers on \(writers) stores",
                                   value: result.throughput, unit: "req/s", p50: result.p50, p99: result.p99, note: note + errors(result.errors)))
            }
        }
        if let eight = durable["1-8"], let sixtyFour = durable["1-64"] {
            let (p50, p99) = (floor.percentile(0.5), floor.percentile(0.99))
            for (writers, result) in [(8, eight), (64, sixtyFour)] {
                check(TargetCheck(target: "host log: durable INSERT, \(writers) writers on \(writers) stores: p50 ≤ 1.5× and p99 ≤ 3× one PUT's",
                                  measured: String(format: "p50 %.2f×, p99 %.2f×", result.p50 / max(p50, 1), result.p99 / max(p99, 1)),
                                  met: result.p50 <= 1.5 * p50 && result.p99 <= 3 * p99))
            }
            if let requestsPerWrite {
                check(TargetCheck(target: "host log: ≤ 0.05 S3 requests per durable write, 64 writers on 64 stores",
                                  measured: String(format: "%.3f", requestsPerWrite), met: requestsPerWrite <= 0.05))
            }
            let scale = sixtyFour.throughput / max(eight.throughput, 1)
            check(TargetCheck(target: "host log: 64 writers ≥ 6× the 8 writers' throughput", measured: String(format: "%.1f×", scale), met: scale >= 6))
        }
        if newStoreP50.count >= 2 {
            let (on, off) = (newStoreP50[1], newStoreP50[0])
            check(TargetCheck(target: "new store with replication on S3: p50 ≤ 1.2× replication off",
                              measured: String(format: "p50 %@ µs (%.2f×)", format(on), on / max(off, 1)), met: on <= 1.2 * off))
        }
    }

    /// 200 PUTs of 4 KiB, one after another, with the project's S3 client (what the daemon uses).
    func putFloor(endpoint: String) async throws -> Latencies {
        let client = try S3Client(endpoint: .init(url: endpoint, region: "us-east-1", pathStyle: true),
                                  credentials: S3Credentials(accessKeyID: "userstore-dev", secretAccessKey: "userstore-dev-secret"))
        let body = Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        var samples: [UInt64] = []
        for index in 0..<(quick ? 50 : 200) {
            let before = nanoseconds()
            _ = try await client.putObject(bucket: "userstore", key: "bench-\(getpid())-floor/\(index)", body: body)
            samples.append(nanoseconds() - before)
        }
        return Latencies(samples: samples)
    }
}
