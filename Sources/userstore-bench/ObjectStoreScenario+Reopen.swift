import Foundation
import UserStoreClient

extension ObjectStoreScenario {
    /// Stores of 10 MB closed by LRU and reopened for one INSERT each (scenario 8, issue #38:
    /// reopening should cost what changed, not the store): the reopen's latency, and — with
    /// replication on — what it uploaded, counted on the S3 side (a boto3 listing of the bucket
    /// before and after: the level-0 LTX objects that appeared; compactions write higher levels
    /// on their own schedule). Returns the latencies' p50 in µs.
    func reopenCost(mode: String, index: Int, config: String, baselineP50: Double?, bucketPrefix: String?, s3Endpoint: String) async throws -> Double {
        let big = 4, size = 10 * 1_048_576
        let fleet = try await kvFleet(name: "s3-reopen-\(index)", count: 2 * big, rows: 0)
        let (daemon, socket) = try env.startDaemon(name: "s3-reopen-\(index)", data: fleet.data, migrations: fleet.migrations, maxOpenStores: big, extra: config)
        defer { env.stop(daemon) }
        let client = UserStoreClient(socketPath: socket)
        try await client.connect()
        func insert(_ user: String, _ value: String) async throws {
            _ = try await client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string("INSERT INTO kv (value) VALUES (\(value))")])
        }
        // Four stores of 10 MB (durable, with replication on: in the bucket), then four others
        // take every open slot and the big ones are synced, let go of and closed.
        for user in fleet.users.prefix(big) { try await insert(user, "hex(randomblob(\(size / 2)))") }
        for user in fleet.users.suffix(big) { try await insert(user, "'small'") }
        if bucketPrefix != nil {
            // Set-up, not a measurement: until replication shows none of the big stores open.
            for _ in 0..<300 {
                let open = (try? await client.call("io.userstore.Admin.Replication"))?["stores"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
                if Set(open).isDisjoint(with: fleet.users.prefix(big)) { break }
                usleep(100_000)
            }
        }
        let before = bucketPrefix.map { objects(under: $0, endpoint: s3Endpoint) } ?? [:]
        var samples: [UInt64] = [], failures = 0
        for user in fleet.users.prefix(big) {
            let started = nanoseconds()
            if (try? await insert(user, "'after the reopen'")) == nil { failures += 1 }
            samples.append(nanoseconds() - started)
        }
        await client.shutdown()
        let latencies = Latencies(samples: samples)
        var note = baselineP50.map { String(format: "p50 %.2f× replication off; ", latencies.percentile(0.5) / max($0, 1)) } ?? ""
        note += errors(failures)
        if let bucketPrefix {
            let after = objects(under: bucketPrefix, endpoint: s3Endpoint)
            // Litestream's level 0 is `<user>/0000/` in a bucket; the host log's objects end in `.usl`.
            let added = after.filter { before[$0.key] == nil && ($0.key.contains("/0000/") || $0.key.hasSuffix(".usl")) }
            let bytes = added.values.reduce(0, +)
            let share = Double(bytes) / Double(big * size)
            note += String(format: "uploaded %d objects, %d bytes: %.3f%% of the stores' size", added.count, bytes, share * 100)
            check(TargetCheck(target: "reopening an unchanged 10 MB store uploads < 1% of its size (S3 side)",
                              measured: String(format: "%.3f%% (%d bytes for %d reopens)", share * 100, bytes, big), met: share < 0.01))
        }
        record(Measurement(scenario: "8. replication on S3", subject: "reopen of a closed 10 MB store + 1 INSERT, \(mode)",
                           value: Double(samples.count) / (Double(samples.reduce(0, +)) / 1e9), unit: "reopens/s",
                           p50: latencies.percentile(0.5), p99: latencies.percentile(0.99), note: note))
        return latencies.percentile(0.5)
    }

    /// Every object under `prefix` in the bench's bucket and its size, listed with boto3
    /// (Tests/Helpers/s3-probe.py), not with the daemon's own S3 client.
    func objects(under prefix: String, endpoint: String) -> [String: Int] {
        let python = env.repository + "/.build/testenv/bin/python3", probe = env.repository + "/Tests/Helpers/s3-probe.py"
        let (status, output) = shell("env -u AWS_CA_BUNDLE '\(python)' '\(probe)' '\(endpoint)' sizes userstore '\(prefix)'")
        guard status == 0 else { return [:] }
        var sizes: [String: Int] = [:]
        for line in output.split(separator: "\n") {
            let parts = line.split(separator: " ")
            if parts.count == 2, let size = Int(parts[1]) { sizes[String(parts[0])] = size }
        }
        return sizes
    }
}
