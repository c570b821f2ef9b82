import Foundation
import GRDB
import UserStoreCore

/// The five scenarios of the benchmark issue, each with its baseline measured in the same run.
struct Scenarios {
    let env: BenchEnvironment
    let seconds: Double
    let quick: Bool
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

    // MARK: 1. Point queries

    mutating func pointQueries() async throws {
        log("1. point queries: preparing 1,000 users x 10,000 rows")
        let fleet = try await kvFleet(name: "point", count: 1000, rows: 10_000)
        let (daemon, socket) = try env.startDaemon(name: "point", data: fleet.data, migrations: fleet.migrations)
        let users = fleet.users.map { Array("{\"method\":\"io.userstore.Store.Query\",\"parameters\":{\"user\":\"\($0)\",\"sql\":\"\(Self.pointQuery)\",\"parameters\":[".utf8) }
        let makeRequests: @Sendable (Int) -> (() -> [UInt8]) = { index in
            var random = FastRandom(state: UInt64(index + 1) * 7919)
            return { users[random.below(users.count)] + Array("\(random.below(10_000) + 1)]}}".utf8) + [0] }
        }
        _ = runConnections(8, seconds: min(seconds, 3), socket: socket, request: makeRequests) // warm: open every store
        var daemonThroughput: [Int: Double] = [:]
        for clients in [1, 8, 64] {
            let cpuBefore = cpuMicroseconds(of: daemon.processIdentifier)
            let result = runConnections(clients, seconds: seconds, socket: socket, request: makeRequests)
            let cpuPerRequest = (cpuMicroseconds(of: daemon.processIdentifier) - cpuBefore) / max(result.throughput * seconds, 1)
            daemonThroughput[clients] = result.throughput
            measurements.append(Measurement(scenario: "1. point query", subject: "userstored, \(clients) client\(clients == 1 ? "" : "s")",
                                            value: result.throughput, unit: "req/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99),
                                            note: "daemon CPU \(format(cpuPerRequest)) µs/request" + (result.errors == 0 ? "" : "; \(result.errors) errors")))
            if clients == 8 {
                let p99 = result.latencies.percentile(0.99)
                targets.append(TargetCheck(target: "point query p99 < 1 ms at 8 clients", measured: "\(format(p99)) µs", met: p99 < 1000))
            }
        }
        env.stop(daemon)

        // In-process GRDB on the same files: the physical limit (no socket, no JSON).
        let layout = StoreLayout(dataDirectory: fleet.data)
        let queues = try fleet.users.map { try DatabaseQueue(path: layout.storePath(for: try UserID($0))) }
        for clients in [1, 8, 64] {
            let result = runLoad(threads: clients, seconds: seconds) { index in
                let box = RandomBox(FastRandom(state: UInt64(index + 1) * 104_729))
                return {
                    let queue = queues[box.below(queues.count)]
                    return (try? queue.inDatabase { db in try String.fetchOne(db.cachedStatement(sql: Self.pointQuery), arguments: [box.below(10_000) + 1]) }) != nil
                }
            }
            measurements.append(Measurement(scenario: "1. point query", subject: "in-process GRDB, \(clients) thread\(clients == 1 ? "" : "s")",
                                            value: result.throughput, unit: "req/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99),
                                            note: String(format: "userstored reaches %.0f%% of it", 100 * (daemonThroughput[clients] ?? 0) / max(result.throughput, 1))))
        }
        for queue in queues { try? queue.close() }

        guard Postgres.available() else {
            measurements.append(Measurement(scenario: "1. point query", subject: "PostgreSQL 15", value: 0, unit: "tps", note: "not installed"))
            return
        }
        let postgres = Postgres(directory: env.root + "/postgres")
        postgres.start()
        for clients in [1, 8, 64] {
            let (tps, latencies) = postgres.pgbench("-S", clients: clients, seconds: Int(seconds.rounded(.up)))
            let ratio = (daemonThroughput[clients] ?? 0) / max(tps, 1)
            measurements.append(Measurement(scenario: "1. point query", subject: "PostgreSQL 15 pgbench -S -M prepared, \(clients) client\(clients == 1 ? "" : "s")",
                                            value: tps, unit: "tps", p50: latencies.percentile(0.5), p99: latencies.percentile(0.99),
                                            note: String(format: "userstored / PostgreSQL = %.2f×", ratio)))
            if clients != 1 {
                targets.append(TargetCheck(target: "point queries ≥ 1.5× PostgreSQL at \(clients) clients", measured: String(format: "%.2f×", ratio), met: ratio >= 1.5))
            }
        }
        postgres.stop()
    }

    // MARK: 2. Durable writes

    mutating func durableWrites() async throws {
        log("2. durable writes")
        let fleet = try await kvFleet(name: "writes", count: 8, rows: 0)
        let (daemon, socket) = try env.startDaemon(name: "writes", data: fleet.data, migrations: fleet.migrations)
        var daemonRates: [Int: Double] = [:]
        for clients in [1, 8] {
            let result = runConnections(clients, seconds: seconds, socket: socket) { index in
                let request = Array("{\"method\":\"io.userstore.Store.Execute\",\"parameters\":{\"user\":\"u\(String(format: "%05d", index))\",\"sql\":\"INSERT INTO kv (value) VALUES ('durable write')\"}}".utf8) + [0]
                return { request }
            }
            daemonRates[clients] = result.throughput
            measurements.append(Measurement(scenario: "2. durable INSERT", subject: "userstored, \(clients == 1 ? "1 user" : "\(clients) users, 1 client each")",
                                            value: result.throughput, unit: "req/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99)))
        }
        env.stop(daemon)
        let layout = StoreLayout(dataDirectory: fleet.data)
        for clients in [1, 8] {
            let queues = try (0..<clients).map { index -> DatabaseQueue in
                var config = Configuration()
                config.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
                return try DatabaseQueue(path: layout.storePath(for: try UserID(fleet.users[index])), configuration: config)
            }
            let result = runLoad(threads: clients, seconds: seconds) { index in
                { (try? queues[index].inDatabase { try $0.execute(sql: "INSERT INTO kv (value) VALUES ('durable write')") }) != nil }
            }
            measurements.append(Measurement(scenario: "2. durable INSERT", subject: "in-process GRDB (WAL, synchronous=FULL), \(clients) thread\(clients == 1 ? "" : "s")",
                                            value: result.throughput, unit: "ops/s", p50: result.latencies.percentile(0.5), p99: result.latencies.percentile(0.99),
                                            note: String(format: "userstored reaches %.0f%% of it", 100 * (daemonRates[clients] ?? 0) / max(result.throughput, 1))))
            for queue in queues { try? queue.close() }
        }
    }

    // MARK: 3. Cold open

    mutating func coldOpen() throws {
        log("3. cold open")
        var p50: [Bool: Double] = [:]
        for template in [false, true] {
            let name = template ? "cold-template" : "cold"
            let (daemon, socket) = try env.startDaemon(name: name, data: env.root + "/\(name)-data", migrations: env.exampleMigrations, template: template)
            let client = SocketClient(path: socket)
            let count = quick ? 100 : 300
            var samples: [UInt64] = []
            var failures = 0
            let started = nanoseconds()
            for index in 0..<count {
                let request = Array("{\"method\":\"io.userstore.Store.Open\",\"parameters\":{\"user\":\"cold\(index)\"}}".utf8) + [0]
                let before = nanoseconds()
                if !client.roundTrip(request) { failures += 1 }
                samples.append(nanoseconds() - before)
            }
            let rate = Double(count) / (Double(nanoseconds() - started) / 1e9)
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

    // MARK: 4. Fleet migration

    mutating func fleetMigration() async throws {
        let count = quick ? 2000 : 10_000
        log("4. fleet migration: \(count) stores x 100 rows, 3 pending migrations")
        let first3 = env.root + "/fleet-migrations-3", all = env.root + "/fleet-migrations-6"
        for directory in [first3, all] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        let files = try FileManager.default.contentsOfDirectory(atPath: env.exampleMigrations).sorted()
        for (index, file) in files.enumerated() {
            if index < 3 { try FileManager.default.copyItem(atPath: env.exampleMigrations + "/" + file, toPath: first3 + "/" + file) }
            try FileManager.default.copyItem(atPath: env.exampleMigrations + "/" + file, toPath: all + "/" + file)
        }
        let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) INSERT INTO notes (title, body) SELECT ' note ' || i, 'body ' || i FROM n;"
        let seed = try await env.makeSeed(data: env.root + "/fleet-seed", migrations: try MigrationSet.load(directory: first3), user: "seed", fill: fill)
        let data = env.root + "/fleet-data"
        try env.clone(seed, into: data, users: users(count))
        let (daemon, socket) = try env.startDaemon(name: "fleet", data: data, migrations: all)
        let started = nanoseconds()
        let (status, _) = shell("\(env.binaries)/userstorectl migrate --all --parallel 8 --json --socket \(socket) > \(env.root)/fleet.jsonl")
        let seconds = Double(nanoseconds() - started) / 1e9
        env.stop(daemon)
        let rate = Double(count) / seconds
        let migrated = (try? String(contentsOfFile: env.root + "/fleet.jsonl", encoding: .utf8))?.components(separatedBy: "\"state\":\"migrated\"").count ?? 1
        measurements.append(Measurement(scenario: "4. fleet migration", subject: "userstorectl migrate --all (\(count) stores, parallel 8, backups on)",
                                        value: rate, unit: "stores/s", note: "exit \(status), \(migrated - 1) migrated in \(format(seconds)) s"))

        // Baseline: a shell loop running the sqlite3 CLI with the same SQL, one transaction per migration.
        let pending = try files.dropFirst(3).map { file -> String in
            let migration = try MigrationFileParser.parse(version: 1, name: file, fileName: file,
                                                          contents: String(contentsOfFile: env.exampleMigrations + "/" + file, encoding: .utf8))
            return "BEGIN;\n" + migration.up.joined(separator: "\n") + "\nCOMMIT;"
        }.joined(separator: "\n")
        try ("PRAGMA foreign_keys = OFF;\n" + pending).write(toFile: env.root + "/pending.sql", atomically: true, encoding: .utf8)
        let sample = quick ? 200 : 1000
        let baselineDirectory = env.root + "/fleet-baseline"
        try FileManager.default.createDirectory(atPath: baselineDirectory, withIntermediateDirectories: true)
        for index in 0..<sample { try FileManager.default.copyItem(atPath: seed, toPath: baselineDirectory + "/s\(index).sqlite") }
        let baselineStart = nanoseconds()
        shell("for f in \(baselineDirectory)/*.sqlite; do sqlite3 \"$f\" < \(env.root)/pending.sql || exit 1; done")
        let baselineRate = Double(sample) / (Double(nanoseconds() - baselineStart) / 1e9)
        measurements.append(Measurement(scenario: "4. fleet migration", subject: "shell loop of sqlite3 (\(sample)-store sample)", value: baselineRate, unit: "stores/s",
                                        note: String(format: "userstored / loop = %.1f×", rate / baselineRate)))

        // The fsync-bound limit: commits per store × fsync latency ÷ parallelism.
        let fsync = fsyncLatency(in: data)
        let commitsPerStore = 5.0 // 3 migrations + the app_version update with the last one + the checkpoint at close
        let limit = 8 / (commitsPerStore * fsync / 1e6)
        measurements.append(Measurement(scenario: "4. fleet migration", subject: "fsync-bound limit (8 × 1 / (\(Int(commitsPerStore)) commits × \(format(fsync)) µs))",
                                        value: limit, unit: "stores/s", note: "measured fsync of a 4 KiB write in the data directory"))
        targets.append(TargetCheck(target: "fleet migration ≥ 1,000 stores/s", measured: "\(format(rate)) stores/s", met: rate >= 1000))
        targets.append(TargetCheck(target: "fleet migration ≥ 10× the sqlite3 loop", measured: String(format: "%.1f×", rate / baselineRate), met: rate / baselineRate >= 10))
    }

    func fsyncLatency(in directory: String) -> Double {
        let path = directory + "/fsync-probe"
        let fd = open(path, O_WRONLY | O_CREAT, 0o600)
        defer { close(fd); unlink(path) }
        var block = [UInt8](repeating: 7, count: 4096)
        let started = nanoseconds()
        for _ in 0..<200 {
            _ = block.withUnsafeMutableBytes { pwrite(fd, $0.baseAddress, 4096, 0) }
            fsync(fd)
        }
        return Double(nanoseconds() - started) / 200 / 1000
    }

    // MARK: 5. Memory

    mutating func memory() async throws {
        let count = quick ? 20_000 : 100_000
        log("5. memory: touching \(count) users with maxOpenStores = 1024")
        let seed = try await env.makeSeed(data: env.root + "/memory-seed", migrations: try MigrationSet.load(directory: env.exampleMigrations), user: "seed", fill: "")
        let data = env.root + "/memory-data"
        let names = users(count, prefix: "m")
        try env.clone(seed, into: data, users: names)
        let (daemon, socket) = try env.startDaemon(name: "memory", data: data, migrations: env.exampleMigrations, maxOpenStores: 1024)
        let next = Counter()
        let started = nanoseconds()
        let result = runLoad(threads: 16, seconds: 3600) { _ in
            let client = SocketClient(path: socket)
            return {
                let index = next.next()
                guard index < names.count else { return false }
                return client.roundTrip(Array("{\"method\":\"io.userstore.Store.Open\",\"parameters\":{\"user\":\"\(names[index])\"}}".utf8) + [0])
            }
        } stopWhen: { next.value >= names.count }
        let seconds = Double(nanoseconds() - started) / 1e9
        let status = (try? String(contentsOfFile: "/proc/\(daemon.processIdentifier)/status", encoding: .utf8)) ?? ""
        let rss = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }.flatMap { Double($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.processIdentifier)/fd").count) ?? 0
        env.stop(daemon)
        measurements.append(Measurement(scenario: "5. memory", subject: "RSS after touching \(count) users", value: rss / 1024, unit: "MiB",
                                        note: "\(fds) open fds; \(Int(result.throughput)) opens/s over \(format(seconds)) s"))
        targets.append(TargetCheck(target: "memory < 256 MiB RSS after \(count) users", measured: "\(format(rss / 1024)) MiB", met: rss / 1024 < 256))
        targets.append(TargetCheck(target: "< 1,200 fds after \(count) users", measured: "\(fds)", met: fds < 1200))
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
    var value: Int { lock.lock(); defer { lock.unlock() }; return current }
}
