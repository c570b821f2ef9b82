import Foundation
import UserStoreConfiguration
import UserStoreCore

/// Scenario 4: `userstorectl migrate --all` over a fleet, on several file systems, against a
/// shell loop of the sqlite3 CLI and a C floor.
struct FleetMigrationScenario: Scenario {
    let bench: Bench
    /// Stores per run (nil: 10,000, 2,000 with --quick).
    var fleetStores: Int?
    /// The daemon's fleetParallelism (nil: its default).
    var fleetParallelism: Int?
    /// Which releases run: `additive`, `rebuild`.
    var fleetReleases: Set<String> = ["additive", "rebuild"]
    /// Which file systems: `root`, `ext4`, `xfs`.
    var fileSystems: Set<String> = ["root", "ext4", "xfs"]

    /// One kind of release: the migrations pending on every store, and the backup setting.
    struct FleetRelease {
        /// `additive` or `rebuild`.
        let name: String
        /// The rows' description of it.
        let subject: String
        /// Folder with the three seed migrations and the three pending ones.
        let migrations: String
        /// The pending migrations as sqlite3 shell input, one transaction each.
        let loopScript: String
        /// The pending migrations' Up SQL for userstore-fleet-floor, separated by `--;;` lines.
        let floorScript: String
        /// `migrations.backupBeforeMigrating` for the daemon.
        let backups: MigrationPolicy.BackupMode
        /// fsyncs per store with `migrations.fleetSyncMethod: fsync`, counted with strace:
        /// SQLite syncs a new WAL's header and its directory, then the run's closing checkpoint
        /// syncs the WAL and the database (its commits are NORMAL); a copy adds its file and
        /// folder. With `syncfs` (the default, which the runs here use) only a copy's 2 remain,
        /// and the stores waiting at one moment share each syncfs.
        let fsyncsPerStore: Double
    }

    /// `userstorectl migrate --all` over `count` stores of 100 rows with 3 pending migrations,
    /// on the root file system and on a journaled ext4 and an XFS made in loop images, each
    /// beside a shell loop of the sqlite3 CLI running the same SQL in the same file system.
    func run() async throws {
        let count = fleetStores ?? (quick ? 2000 : 10_000), sample = min(count, quick ? 200 : 1000)
        log("4. fleet migration: \(count) stores x 100 rows, 3 pending migrations, per file system")
        let examples = try FileManager.default.contentsOfDirectory(atPath: env.exampleMigrations).sorted()
        let seedMigrations = try migrationFolder("fleet-seed-migrations", examples.prefix(3).map { ($0, try exampleText($0)) })
        let fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) INSERT INTO notes (title, body) SELECT ' note ' || i, 'body ' || i FROM n;"
        let seed = try await env.makeSeed(data: env.root + "/fleet-seed", migrations: try MigrationSet.load(directory: seedMigrations), user: "seed", fill: fill)

        let additive = [("0004_color.sql", "ALTER TABLE notes ADD COLUMN color TEXT;"),
                        ("0005_archived.sql", "ALTER TABLE notes ADD COLUMN archived INTEGER NOT NULL DEFAULT 0;"),
                        ("0006_edited_at.sql", "ALTER TABLE notes ADD COLUMN edited_at TEXT;")]
        let rebuild = try examples.dropFirst(3).map { ($0, try exampleText($0)) }
        let releases = [
            FleetRelease(name: "additive", subject: "3 add-column migrations, backupBeforeMigrating auto (no copy)",
                         migrations: try migrationFolder("fleet-additive", examples.prefix(3).map { ($0, try exampleText($0)) } + additive),
                         loopScript: try loopScript(additive), floorScript: try floorScript(additive), backups: .auto, fsyncsPerStore: 4),
            FleetRelease(name: "rebuild", subject: "index + data fix + table rebuild (0004-0006), backups forced on",
                         migrations: try migrationFolder("fleet-rebuild", examples.map { ($0, try exampleText($0)) }),
                         loopScript: try loopScript(rebuild), floorScript: try floorScript(rebuild), backups: .always, fsyncsPerStore: 6),
        ]

        let seedBytes = (try? FileManager.default.attributesOfItem(atPath: seed)[.size] as? Int) ?? 65_536
        // Stores, their WALs while open, the copies and the loop's sample, with room to spare.
        let imageBytes = max(1 << 30, seedBytes * (count + sample) * 4 + (512 << 20))
        var systems = fileSystems.contains("root") ? [ScratchFileSystem.root(env.root + "/fleet-root")] : []
        for type in ["ext4", "xfs"] where fileSystems.contains(type) {
            if let system = ScratchFileSystem.mounted(type, bytes: imageBytes, under: env.root) { systems.append(system) }
        }
        defer { for system in systems { system.remove() } }

        var results: [String: (rate: Double, loop: Double)] = [:]
        for system in systems {
            let fsync = system.fsyncLatency()
            for release in releases where fleetReleases.contains(release.name) {
                let (rate, note) = try runFleet(release, on: system, seed: seed, count: count)
                let loop = try runLoop(release, on: system, seed: seed, sample: sample)
                results[system.label + release.name] = (rate, loop)
                let scenario = "4. fleet migration, \(system.label)"
                record(Measurement(scenario: scenario, subject: "userstorectl migrate --all: \(release.subject)",
                                   value: rate, unit: "stores/s", note: note))
                if let (floor, floorNote) = try runFloor(release, on: system, seed: seed, count: count) {
                    record(Measurement(scenario: scenario, subject: "SQLite alone: the same statements and syncs per store from C, \(parallelism) threads, no copies (userstore-fleet-floor)",
                                       value: floor, unit: "stores/s", note: floorNote + String(format: "; userstored reaches %.0f%% of it", 100 * rate / floor)))
                }
                record(Measurement(scenario: scenario, subject: "shell loop of sqlite3, same SQL (\(sample)-store sample)",
                                   value: loop, unit: "stores/s", note: String(format: "userstored / loop = %.1f×", rate / loop)))
                // One at a time; journal commits batch concurrent fsyncs, so parallel runs can pass
                // it, and the default group commit (syncfs) shares its syncs among stores.
                record(Measurement(scenario: scenario, subject: "fsync-bound limit of \(release.name) synced file by file (fleetSyncMethod: fsync), serial: 1 / (\(Int(release.fsyncsPerStore)) fsyncs × \(format(fsync)) µs)",
                                   value: 1e6 / (release.fsyncsPerStore * fsync), unit: "stores/s",
                                   note: "fdatasync of 4 KiB measured in this file system; the runs above use fleetSyncMethod: syncfs"))
            }
        }

        // The targets are set on a journaled ext4 (the root file system when none could be made).
        guard let reference = systems.first(where: { $0.label.hasPrefix("ext4") }) ?? systems.first else { return }
        let additiveResult = results[reference.label + "additive"] ?? (0, 1)
        let rebuildResult = results[reference.label + "rebuild"] ?? (0, 1)
        check(TargetCheck(target: "fleet migration ≥ 1,000 stores/s, additive, auto (\(reference.label))",
                          measured: "\(format(additiveResult.rate)) stores/s", met: additiveResult.rate >= 1000))
        check(TargetCheck(target: "fleet migration ≥ 5× the sqlite3 loop, additive, auto (\(reference.label))",
                          measured: String(format: "%.1f×", additiveResult.rate / additiveResult.loop), met: additiveResult.rate / additiveResult.loop >= 5))
        check(TargetCheck(target: "fleet migration ≥ 3× the sqlite3 loop, backups forced on (\(reference.label))",
                          measured: String(format: "%.1f×", rebuildResult.rate / rebuildResult.loop), met: rebuildResult.rate / rebuildResult.loop >= 3))
    }

    /// Clones the seed `count` times into `system`, migrates them all through a daemon, and
    /// returns the rate and a note (exit status, stores migrated, copies, daemon CPU per store).
    private func runFleet(_ release: FleetRelease, on system: ScratchFileSystem, seed: String, count: Int) throws -> (Double, String) {
        let data = system.directory + "/fleet-\(release.name)-data"
        try env.clone(seed, into: data, users: users(count))
        shell("sync")
        let (daemon, socket) = try env.startDaemon(name: "fleet-\(release.name)", data: data, migrations: release.migrations, backups: release.backups,
                                                   extra: fleetParallelism.map { "fleetParallelism: \($0)" } ?? "")
        let cpuBefore = cpuMicroseconds(of: daemon.processIdentifier)
        let started = nanoseconds()
        let output = env.root + "/fleet-\(release.name).jsonl"
        let (status, _) = shell("\(env.binaries)/userstorectl migrate --all --json --socket \(socket) > \(output)")
        let seconds = Double(nanoseconds() - started) / 1e9
        let cpu = cpuMicroseconds(of: daemon.processIdentifier) - cpuBefore
        env.stop(daemon)
        let migrated = ((try? String(contentsOfFile: output, encoding: .utf8))?.components(separatedBy: "\"state\":\"migrated\"").count ?? 1) - 1
        let copies = shell("find \(data)/backups -name '*.sqlite' 2>/dev/null | wc -l").1.trimmingCharacters(in: .whitespacesAndNewlines)
        shell("rm -rf \(data)")
        let note = "exit \(status), \(migrated) migrated in \(format(seconds)) s, \(copies) copies; daemon CPU \(format(cpu / Double(count))) µs/store"
        return (Double(count) / seconds, note)
    }

    /// The daemon's parallelism in these runs (its default unless --fleet-parallelism).
    private var parallelism: Int { fleetParallelism ?? DaemonConfiguration.defaultFleetParallelism }

    /// `bench/userstore-fleet-floor.c` over `count` clones of the seed in `system`: the
    /// statements userstored runs per store, from C, at the daemon's parallelism — what SQLite
    /// and the file system allow before anything of ours runs. Nil when it was not built.
    private func runFloor(_ release: FleetRelease, on system: ScratchFileSystem, seed: String, count: Int) throws -> (Double, String)? {
        let binary = env.binaries + "/userstore-fleet-floor"
        guard FileManager.default.isExecutableFile(atPath: binary) else { return nil }
        let data = system.directory + "/fleet-\(release.name)-floor"
        let ids = users(count)
        try env.clone(seed, into: data, users: ids)
        let layout = StoreLayout(dataDirectory: data)
        let list = env.root + "/fleet-floor-paths", script = env.root + "/fleet-floor-\(release.name).sql"
        try ids.map { layout.storePath(for: try UserID($0)) }.joined(separator: "\n").write(toFile: list, atomically: true, encoding: .utf8)
        try release.floorScript.write(toFile: script, atomically: true, encoding: .utf8)
        shell("sync")
        let (status, output) = shell("\(binary) \(list) \(script) \(parallelism)")
        shell("rm -rf \(data)")
        guard status == 0, let line = output.split(separator: "\n").last,
              let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
              let seconds = object["seconds"] as? Double, let cpu = object["cpuMicrosecondsPerStore"] as? Double, seconds > 0,
              let syncs = object["syncfsCalls"] as? Int else {
            log("userstore-fleet-floor failed (\(status)): \(output)")
            return nil
        }
        return (Double(count) / seconds, "\(count) stores in \(format(seconds)) s; CPU \(format(cpu)) µs/store; \(syncs) syncfs (group commit, as the daemon)")
    }

    /// The sqlite3 CLI over `sample` copies of the seed in `system`, one process per store.
    private func runLoop(_ release: FleetRelease, on system: ScratchFileSystem, seed: String, sample: Int) throws -> Double {
        let directory = system.directory + "/fleet-\(release.name)-loop"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for index in 0..<sample { try FileManager.default.copyItem(atPath: seed, toPath: directory + "/s\(index).sqlite") }
        let script = env.root + "/fleet-\(release.name)-loop.sql"
        try release.loopScript.write(toFile: script, atomically: true, encoding: .utf8)
        shell("sync")
        let started = nanoseconds()
        shell("for f in \(directory)/*.sqlite; do sqlite3 \"$f\" < \(script) || exit 1; done")
        let rate = Double(sample) / (Double(nanoseconds() - started) / 1e9)
        shell("rm -rf \(directory)")
        return rate
    }

    private func exampleText(_ file: String) throws -> String {
        try String(contentsOfFile: env.exampleMigrations + "/" + file, encoding: .utf8)
    }

    /// A migrations folder under the benchmark's root holding `files`.
    private func migrationFolder(_ name: String, _ files: [(String, String)]) throws -> String {
        let folder = env.root + "/" + name
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for (file, text) in files { try text.write(toFile: folder + "/" + file, atomically: true, encoding: .utf8) }
        return folder
    }

    /// `files`' Up sections for userstore-fleet-floor: one migration per part, `--;;` between.
    private func floorScript(_ files: [(String, String)]) throws -> String {
        try files.map { file, text in
            try MigrationFileParser.parse(version: 1, name: file, fileName: file, contents: text).up.joined(separator: ";\n")
        }.joined(separator: "\n--;;\n")
    }

    /// `files` as the sqlite3 shell's input: foreign keys off, one transaction per migration.
    private func loopScript(_ files: [(String, String)]) throws -> String {
        let transactions = try files.map { file, text -> String in
            let migration = try MigrationFileParser.parse(version: 1, name: file, fileName: file, contents: text)
            return "BEGIN;\n" + migration.up.joined(separator: "\n") + "\nCOMMIT;"
        }
        return "PRAGMA foreign_keys = OFF;\n" + transactions.joined(separator: "\n")
    }
}
