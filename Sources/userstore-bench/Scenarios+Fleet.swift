import Foundation
import UserStoreCore

extension Scenarios {
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
}
