import Foundation
import GRDB
import UserStoreClient
import UserStoreCore

/// The five scenarios of the benchmark issue, each with its baseline measured in the same run.
struct Scenarios {
    let env: BenchEnvironment
    let seconds: Double
    let quick: Bool
    /// The C load generator (nil when it was not built: its rows say so).
    let load: LoadGenerator?
    /// Scenario 4's stores per run (nil: its default) and file systems (`root`, `ext4`, `xfs`).
    var fleetStores: Int?
    var fleetParallelism: Int?
    var fleetReleases: Set<String> = ["additive", "rebuild"]
    var fileSystems: Set<String> = ["root", "ext4", "xfs"]
    var measurements: [Measurement] = []
    var targets: [TargetCheck] = []

    static let kvMigration = "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL);"
    static let pointQuery = "SELECT value FROM kv WHERE id = ?"

    func users(_ count: Int, prefix: String = "u") -> [String] { (0..<count).map { String(format: "\(prefix)%05d", $0) } }

    /// The kv migrations directory and a data directory of `count` users with `rows` rows each.
    func kvFleet(name: String, count: Int, rows: Int) async throws -> (data: String, migrations: String, users: [String]) {
        let migrations = env.root + "/\(name)-migrations", data = env.root + "/\(name)-data"
        try FileManager.default.createDirectory(atPath: migrations, withIntermediateDirectories: true)
        try Self.kvMigration.write(toFile: migrations + "/0001_kv.sql", atomically: true, encoding: .utf8)
        let fill = rows == 0 ? "" : "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(rows)) INSERT INTO kv (id, value) SELECT i, hex(randomblob(16)) FROM n;"
        let seed = try await env.makeSeed(data: env.root + "/\(name)-seed", migrations: try MigrationSet.load(directory: migrations), user: "seed", fill: fill)
        let users = self.users(count)
        try env.clone(seed, into: data, users: users)
        return (data, migrations, users)
    }

    // MARK: 3. Cold open

    mutating func coldOpen() async throws {
        log("3. cold open")
        var p50: [Bool: Double] = [:]
        for template in [false, true] {
            let name = template ? "cold-template" : "cold"
            let (daemon, socket) = try env.startDaemon(name: name, data: env.root + "/\(name)-data", migrations: env.exampleMigrations, template: template)
            let client = UserStoreClient(socketPath: socket)
            try await client.connect() // not part of the first sample
            let count = quick ? 100 : 300
            var samples: [UInt64] = []
            var failures = 0
            let started = nanoseconds()
            for index in 0..<count {
                let store = client.store(for: "cold\(index)")
                let before = nanoseconds()
                if (try? await store.open()) == nil { failures += 1 }
                samples.append(nanoseconds() - before)
            }
            let rate = Double(count) / (Double(nanoseconds() - started) / 1e9)
            await client.shutdown()
            env.stop(daemon)
            let latencies = Latencies(samples: samples)
            p50[template] = latencies.percentile(0.5)
            let ratio = template ? String(format: "%.1f× faster than migrating (p50)", (p50[false] ?? 0) / max(latencies.percentile(0.5), 1)) : ""
            measurements.append(Measurement(scenario: "3. cold open", subject: template ? "new store copied from the template (6 migrations)" : "new store + 6 example migrations, step by step",
                                            value: rate, unit: "stores/s", p50: latencies.percentile(0.5), p99: latencies.percentile(0.99),
                                            note: ratio + (failures == 0 ? "" : " \(failures) errors")))
        }
        let templated = p50[true] ?? .infinity
        targets.append(TargetCheck(target: "cold open from the template: p50 < 1 ms", measured: "p50 \(format(templated)) µs", met: templated < 1000))
    }
}

/// A shared random generator for one worker (workers never share one).
final class RandomBox: @unchecked Sendable { // used by exactly one worker thread
    var random: FastRandom
    init(_ random: FastRandom) { self.random = random }
    func below(_ bound: Int) -> Int { random.below(bound) }
}

/// Hands out indexes to workers.
final class Counter: @unchecked Sendable { // guarded by the lock
    private var current = 0
    private let lock = NSLock()
    func next() -> Int { lock.lock(); defer { lock.unlock() }; current += 1; return current - 1 }
}
