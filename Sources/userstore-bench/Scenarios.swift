import Foundation
import UserStoreCore

/// What every scenario of the benchmark shares: the machine's environment, the run's settings,
/// the C load generator and the report the rows go to.
struct Bench {
    let env: BenchEnvironment
    let seconds: Double
    let quick: Bool
    /// The C load generator (nil when it was not built: its rows say so).
    let load: LoadGenerator?
    let report = Report()

    static let kvMigration = "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL);"
    static let pointQuery = "SELECT value FROM kv WHERE id = ?"
}

/// The rows and target checks of a run, in the order the scenarios produce them.
final class Report: @unchecked Sendable { // guarded by the lock
    private let lock = NSLock()
    private var rows: [Measurement] = []
    private var checks: [TargetCheck] = []
    var measurements: [Measurement] { lock.withLock { rows } }
    var targets: [TargetCheck] { lock.withLock { checks } }
    func add(_ row: Measurement) { lock.withLock { rows.append(row) } }
    func add(_ check: TargetCheck) { lock.withLock { checks.append(check) } }
}

/// One numbered scenario of `make bench`: measures userstored and its baseline in one run.
protocol Scenario {
    var bench: Bench { get }
    func run() async throws
}

extension Scenario {
    var env: BenchEnvironment { bench.env }
    var seconds: Double { bench.seconds }
    var quick: Bool { bench.quick }
    var load: LoadGenerator? { bench.load }

    func record(_ row: Measurement) { bench.report.add(row) }
    func check(_ target: TargetCheck) { bench.report.add(target) }
    func errors(_ count: Int) -> String { count == 0 ? "" : "; \(count) errors" }

    /// Runs `measure` for side B off and on in turn (off, on, off, on…, `pairs` of each) — each
    /// run on a daemon of its own, so that the VM's drift falls on both sides — and records each
    /// side's mean as a row (`subject(on)`), the runs in its note, the second also
    /// `note(off, on)` (default: the ratio). Returns the two means.
    @discardableResult
    func alternating(scenario: String, pairs: Int = 2, subject: (Bool) -> String, note: (Double, Double) -> String = { String(format: "on / off = %.2f", $1 / max($0, 1)) },
                     _ measure: (Bool) async throws -> LoadGenerator.Result?) async rethrows -> (off: Double, on: Double) {
        var runs: [Bool: [LoadGenerator.Result]] = [false: [], true: []]
        for on in (0..<pairs).flatMap({ _ in [false, true] }) {
            if let result = try await measure(on) { runs[on]!.append(result) }
        }
        func mean(_ side: Bool, _ pick: (LoadGenerator.Result) -> Double) -> Double {
            runs[side]!.map(pick).reduce(0, +) / Double(max(runs[side]!.count, 1))
        }
        let off = mean(false) { $0.throughput }, on = mean(true) { $0.throughput }
        for side in [false, true] {
            let list = runs[side]!.map { format($0.throughput) + " (p99 " + format($0.p99) + " µs)" }.joined(separator: ", ")
            record(Measurement(scenario: scenario, subject: subject(side) + " (mean of \(runs[side]!.count))", value: side ? on : off,
                               unit: "req/s", p99: mean(side) { $0.p99 }, note: "runs " + list + (side ? "; " + note(off, on) : "")))
        }
        return (off, on)
    }

    func users(_ count: Int, prefix: String = "u") -> [String] { (0..<count).map { String(format: "\(prefix)%05d", $0) } }

    /// The kv migrations directory and a data directory of `count` users with `rows` rows each.
    func kvFleet(name: String, count: Int, rows: Int) async throws -> (data: String, migrations: String, users: [String]) {
        let migrations = env.root + "/\(name)-migrations", data = env.root + "/\(name)-data"
        try FileManager.default.createDirectory(atPath: migrations, withIntermediateDirectories: true)
        try Bench.kvMigration.write(toFile: migrations + "/0001_kv.sql", atomically: true, encoding: .utf8)
        let fill = rows == 0 ? "" : "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(rows)) INSERT INTO kv (id, value) SELECT i, hex(randomblob(16)) FROM n;"
        let seed = try await env.makeSeed(data: env.root + "/\(name)-seed", migrations: try MigrationSet.load(directory: migrations), user: "seed", fill: fill)
        let users = self.users(count)
        try env.clone(seed, into: data, users: users)
        return (data, migrations, users)
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
