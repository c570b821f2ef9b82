import Foundation
import UserStoreClient

/// Scenario 9: what per-user encryption costs (docs/encryption.md): each row alternates a daemon
/// with encryption off and one with it on (off, on, off, on), on copies of the same stores.
struct EncryptionScenario: Scenario {
    let bench: Bench

    /// The extra configuration of a daemon with encryption on: a key-encryption key and a key
    /// store of its own under the run's folder.
    func encryption(_ name: String) throws -> String {
        let key = env.root + "/\(name)-kek"
        if !FileManager.default.fileExists(atPath: key) {
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString().write(toFile: key, atomically: true, encoding: .utf8)
        }
        try FileManager.default.createDirectory(atPath: env.root + "/\(name)-keys", withIntermediateDirectories: true)
        return "encryption:\n  keyFile: \(key)\n  keyStore: file://\(env.root)/\(name)-keys\n"
    }

    func run() async throws {
        log("9. encryption")
        guard let load else { return }
        // Two copies of 100 users × 10,000 rows: the second is encrypted by its first daemon
        // (each store on its first open), before anything is measured.
        let plain = try await kvFleet(name: "enc-off", count: 100, rows: 10_000)
        let sealed = try await kvFleet(name: "enc-on", count: 100, rows: 10_000)
        let workload = LoadGenerator.Workload(users: 100)
        func daemon(_ on: Bool, _ name: String, maxOpenStores: Int = 1024, extra: String = "") throws -> (Process, String) {
            try env.startDaemon(name: "\(name)-\(on)", data: on ? sealed.data : plain.data, migrations: plain.migrations, maxOpenStores: maxOpenStores,
                                extra: (on ? try encryption("enc") : "") + extra)
        }
        func warm(_ socket: String) async {
            _ = try? await UserStoreClient.withClient(socketPath: socket) { client in
                for user in plain.users { _ = try? await client.store(for: user).query("SELECT sum(length(value)) FROM kv") }
            }
        }
        var ratios: [(String, Double, Double)] = []
        for connections in [1, 8, 64] {
            let (off, on) = try await alternating(scenario: "9. encryption", pairs: 4, subject: { "point query, \(connections) connection\(connections == 1 ? "" : "s"), 100 users, encryption \($0 ? "on" : "off")" }) { on in
                let (process, socket) = try daemon(on, "enc-point")
                defer { env.stop(process) }
                await warm(socket)
                return load.run(socket: socket, connections: connections, seconds: seconds, workload)
            }
            ratios.append(("point queries at \(connections) connection\(connections == 1 ? "" : "s")", off, on))
        }
        let insert = LoadGenerator.Workload(method: "io.userstore.Store.Execute", sql: "INSERT INTO kv (value) VALUES (hex(randomblob(16)))", rows: 0, users: 8, userPerConnection: true)
        // Four pairs on every row: 5–20% targets on rows whose runs spread by as much on this VM
        // (one side's two runs 86,501 and 105,488 req/s, 2026-11-28).
        let (plainOff, plainOn) = try await alternating(scenario: "9. encryption", pairs: 4, subject: { "INSERT, 8 connections, 8 users, encryption \($0 ? "on" : "off")" }) { on in
            let (process, socket) = try daemon(on, "enc-write")
            defer { env.stop(process) }
            await warm(socket)
            return load.run(socket: socket, connections: 8, seconds: seconds, insert)
        }
        ratios.append(("plain writes", plainOff, plainOn))
        // A replica per side: a replica belongs to one data directory.
        let replica = { (on: Bool) in "replication:\n  replica: file://\(env.root)/enc-replica-\(on)\n  durableWrites: true\n" }
        let (durableOff, durableOn) = try await alternating(scenario: "9. encryption", pairs: 4, subject: { "durable INSERT (file:// replica), 8 connections, 8 users, encryption \($0 ? "on" : "off")" }) { on in
            let (process, socket) = try daemon(on, "enc-durable", extra: replica(on))
            defer { env.stop(process) }
            await warm(socket)
            return load.run(socket: socket, connections: 8, seconds: seconds, insert)
        }
        ratios.append(("durable writes", durableOff, durableOn))
        // A closed store's open: 100 users, 4 open at a time, so that nearly every query opens one.
        let (reopenOff, reopenOn) = try await alternating(scenario: "9. encryption", pairs: 4, subject: { "point query opening a closed store (maxOpenStores 4, 100 users), 8 connections, encryption \($0 ? "on" : "off")" }) { on in
            let (process, socket) = try daemon(on, "enc-reopen", maxOpenStores: 4)
            defer { env.stop(process) }
            return load.run(socket: socket, connections: 8, seconds: seconds, workload)
        }
        try await newUsers()
        for (what, off, on) in ratios {
            let limit = what.hasPrefix("point") ? 0.95 : 0.90
            check(TargetCheck(target: "\(what) with encryption ≥ \(Int(limit * 100))% of without", measured: String(format: "%.1f%%", 100 * on / max(off, 1)), met: on >= limit * off))
        }
        check(TargetCheck(target: "opening a closed store with encryption within 20% (throughput ≥ 83% of without)", measured: String(format: "%.1f%%", 100 * reopenOn / max(reopenOff, 1)),
                          met: reopenOn >= reopenOff / 1.2))
    }

    /// A new user's first request (its key made and stored, its store created and migrated),
    /// off and on, alternating.
    private func newUsers() async throws {
        var p50: [Bool: [Double]] = [false: [], true: []]
        for (round, on) in [false, true, false, true].enumerated() {
            let name = "enc-new-\(round)"
            let (process, socket) = try env.startDaemon(name: name, data: env.root + "/\(name)-data", migrations: env.exampleMigrations,
                                                        extra: on ? try encryption(name) : "")
            let client = UserStoreClient(socketPath: socket)
            try await client.connect()
            var samples: [UInt64] = []
            for index in 0..<(quick ? 100 : 300) {
                let before = nanoseconds()
                _ = try? await client.store(for: "new\(index)").open()
                samples.append(nanoseconds() - before)
            }
            await client.shutdown()
            env.stop(process)
            p50[on]!.append(Latencies(samples: samples).percentile(0.5))
        }
        let off = p50[false]!.reduce(0, +) / 2, on = p50[true]!.reduce(0, +) / 2
        for side in [false, true] {
            record(Measurement(scenario: "9. encryption", subject: "new user's first request (6 example migrations), encryption \(side ? "on" : "off")",
                               value: side ? on : off, unit: "µs p50", note: "rounds " + p50[side]!.map(format).joined(separator: ", ")))
        }
        check(TargetCheck(target: "a new user with encryption within 2 ms of without (p50)", measured: "+\(format((on - off) / 1000)) ms", met: on - off <= 2000))
    }
}
