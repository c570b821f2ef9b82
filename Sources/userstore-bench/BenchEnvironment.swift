import Foundation
import UserStoreCore
import GRDB

/// Paths and helpers shared by the scenarios.
struct BenchEnvironment {
    let root: String
    let binaries: String
    let repository: String

    var exampleMigrations: String { repository + "/config/migrations" }

    /// A started userstored on `data` with `migrations` (`backups`: backupBeforeMigrating's
    /// value; fleetParallelism is left at its default, 16 per core); returns its process and socket.
    func startDaemon(name: String, data: String, migrations: String, maxOpenStores: Int = 1024, backups: MigrationPolicy.BackupMode = .always,
                     template: Bool = false, metrics: Bool = false, extra: String = "") throws -> (Process, String) {
        let directory = root + "/" + name
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let socket = directory + "/userstore.sock"
        let config = directory + "/userstored.yaml"
        try """
            appVersion: "2.0.0"
            dataDirectory: \(data)
            socketPath: \(socket)
            migrationsDirectory: \(migrations)
            maxOpenStores: \(maxOpenStores)
            logTarget: stderr
            migrations:
              backupBeforeMigrating: \(backups.rawValue)
              newStoresFromTemplate: \(template)
            \(metrics ? "metrics:\n  listen: unix:\(directory)/metrics.sock" : "")
            \(extra)
            """.write(toFile: config, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binaries + "/userstored")
        process.arguments = ["--config", config]
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        // Benchmark set-up, not a test: poll until the daemon answers.
        for _ in 0..<600 {
            if FileManager.default.fileExists(atPath: socket), shell("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('\(socket)')\"").0 == 0 { break }
            usleep(50_000)
        }
        // A fleet made on disk meeting an empty replica waits for the operator's word that the
        // replica is new (ReplicaMissing otherwise: docs/replication.md, "The replica's identity").
        if extra.contains("replication:") {
            _ = shell("'\(binaries)/userstorectl' --socket '\(socket)' replication init >/dev/null 2>&1")
        }
        return (process, socket)
    }

    /// The constant-reply server (bench/userstore-floor.c), one epoll loop per core, on a socket
    /// of its own: its pid and socket; nil when it was not built. Started through the shell, not
    /// as a Foundation `Process`: with it and the daemon both running, `Process.waitUntilExit`
    /// on the daemon never returned (it spun at half a core).
    func startFloorServer() -> (pid: Int32, socket: String)? {
        let path = binaries + "/userstore-floor", socket = root + "/floor.sock"
        guard FileManager.default.isExecutableFile(atPath: path) else { return nil }
        let (_, output) = shell("'\(path)' --socket '\(socket)' --threads \(ProcessInfo.processInfo.activeProcessorCount) >/dev/null 2>&1 & echo $!")
        guard let pid = Int32(output.trimmingCharacters(in: .whitespacesAndNewlines)) else { return nil }
        for _ in 0..<200 { // set-up, not a test: poll until it listens
            if shell("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('\(socket)')\"").0 == 0 { break }
            usleep(20_000)
        }
        return (pid, socket)
    }

    /// Stops the floor server and waits until it is gone.
    func stopFloorServer(_ pid: Int32) {
        kill(pid, SIGTERM)
        for _ in 0..<500 where kill(pid, 0) == 0 { usleep(10_000) }
    }

    func stop(_ process: Process) {
        process.terminate()
        process.waitUntilExit()
    }

    /// Makes a store for `user` in `data` through the engine, lets `fill` add rows, closes it.
    func makeSeed(data: String, migrations: MigrationSet, user: String, fill: String) async throws -> String {
        let layout = StoreLayout(dataDirectory: data)
        let lock = try DataDirectoryLock(layout: layout)
        let registry = StoreRegistry(configuration: RegistryConfiguration(layout: layout, appVersion: try AppVersion("2.0.0")),
                                     migrations: migrations, lock: lock)
        let id = try UserID(user)
        try await registry.withStore(id) { store in
            try await store.write { db in if !fill.isEmpty { try db.execute(sql: fill) } }
        }
        await registry.shutdown()
        _ = lock
        return layout.storePath(for: id)
    }

    /// Copies `seed` to be the store of each of `users` in `data` (stores are not tied to their user ID).
    func clone(_ seed: String, into data: String, users: [String]) throws {
        let layout = StoreLayout(dataDirectory: data)
        for user in users {
            let id = try UserID(user)
            try FileManager.default.createDirectory(atPath: layout.storeDirectory(for: id), withIntermediateDirectories: true)
            let target = layout.storePath(for: id)
            try? FileManager.default.removeItem(atPath: target)
            try FileManager.default.copyItem(atPath: seed, toPath: target)
        }
    }
}

/// A throwaway PostgreSQL 15 cluster on a Unix socket, run as the postgres user.
struct Postgres {
    let directory: String
    let bin = "/usr/lib/postgresql/15/bin"

    static func available() -> Bool { FileManager.default.fileExists(atPath: "/usr/lib/postgresql/15/bin/pgbench") }

    func start() {
        shell("rm -rf \(directory) && mkdir -p \(directory)/socket && chown -R postgres \(directory)")
        shell("runuser -u postgres -- \(bin)/initdb -D \(directory)/data -A trust >/dev/null")
        _ = shellDetached("runuser -u postgres -- \(bin)/pg_ctl -D \(directory)/data -l \(directory)/log -w -o \"-k \(directory)/socket -c listen_addresses='' -c max_connections=200\" start </dev/null >/dev/null 2>&1")
        shell("runuser -u postgres -- \(bin)/pgbench -h \(directory)/socket -i -s 1 -q postgres")
    }

    /// `pgbench -M prepared` with `clients`: throughput and per-transaction latencies.
    func pgbench(_ mode: String, clients: Int, seconds: Int) -> (Double, Latencies) {
        shell("rm -rf \(directory)/logs && mkdir -p \(directory)/logs && chown postgres \(directory)/logs")
        let (_, output) = shell("cd \(directory)/logs && runuser -u postgres -- \(bin)/pgbench -h \(directory)/socket \(mode) -M prepared -c \(clients) -j \(min(clients, 2)) -T \(seconds) -l postgres")
        let tps = output.split(separator: "\n").first { $0.hasPrefix("tps = ") }.flatMap { Double($0.split(separator: " ")[2]) } ?? 0
        var samples: [UInt64] = []
        for file in (try? FileManager.default.contentsOfDirectory(atPath: directory + "/logs")) ?? [] {
            let text = (try? String(contentsOfFile: directory + "/logs/" + file, encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ")
                if fields.count > 2, let micros = UInt64(fields[2]) { samples.append(micros * 1000) }
            }
        }
        return (tps, Latencies(samples: samples))
    }

    func stop() {
        _ = shellDetached("runuser -u postgres -- \(bin)/pg_ctl -D \(directory)/data -m fast -w stop")
    }
}

extension Postgres {
    /// A pgbench script of 16 point queries sent in one pipeline (`\startpipeline`), the
    /// counterpart of userstore-load's pipelined run; returns queries per second.
    func pipelined(clients: Int, seconds: Int, depth: Int = 16) -> Double {
        let script = directory + "/pipeline.sql"
        let lines = ["\\set aid random(1, 100000 * :scale)", "\\startpipeline"]
            + Array(repeating: "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;", count: depth) + ["\\endpipeline"]
        try? (lines.joined(separator: "\n") + "\n").write(toFile: script, atomically: true, encoding: .utf8)
        shell("chown postgres \(script)")
        let (_, output) = shell("runuser -u postgres -- \(bin)/pgbench -h \(directory)/socket -f \(script) -M prepared -c \(clients) -j \(min(clients, 2)) -T \(seconds) postgres")
        let tps = output.split(separator: "\n").first { $0.hasPrefix("tps = ") }.flatMap { Double($0.split(separator: " ")[2]) } ?? 0
        return tps * Double(depth)
    }
}
