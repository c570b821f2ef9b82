import Foundation
import UserStoreCore
import UserStoreClient

/// Scenario 5: the daemon's memory and file descriptors per open store.
struct MemoryScenario: Scenario {
    let bench: Bench

    func run() async throws {
        let count = quick ? 20_000 : 100_000
        log("5. memory: touching \(count) users with maxOpenStores = 1024")
        let seed = try await env.makeSeed(data: env.root + "/memory-seed", migrations: try MigrationSet.load(directory: env.exampleMigrations), user: "seed", fill: "")
        let data = env.root + "/memory-data"
        let names = users(count, prefix: "m")
        try env.clone(seed, into: data, users: names)
        let (daemon, socket) = try env.startDaemon(name: "memory", data: data, migrations: env.exampleMigrations, maxOpenStores: 1024)
        // Sixteen tasks open the users one after another, over a pool of sixteen connections.
        let client = UserStoreClient(configuration: { var c = UserStoreClient.Configuration(socketPath: socket); c.connections = 16; return c }())
        let next = Counter()
        let started = nanoseconds()
        let failures = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<16 {
                group.addTask {
                    var failures = 0
                    while case let index = next.next(), index < names.count {
                        if (try? await client.store(for: names[index]).open()) == nil { failures += 1 }
                    }
                    return failures
                }
            }
            return await group.reduce(0, +)
        }
        let seconds = Double(nanoseconds() - started) / 1e9
        // Asked before the /proc readings, and the client closed, so that its sixteen sockets are
        // not among the daemon's descriptors counted below.
        let openStores = (try? await client.call("io.userstore.Admin.Status"))?["openStores"]?.integerValue ?? 0
        await client.shutdown()
        let status = (try? String(contentsOfFile: "/proc/\(daemon.processIdentifier)/status", encoding: .utf8)) ?? ""
        let rss = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }.flatMap { Double($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
        let fdDirectory = "/proc/\(daemon.processIdentifier)/fd"
        let fdTargets = ((try? FileManager.default.contentsOfDirectory(atPath: fdDirectory)) ?? []).compactMap {
            try? FileManager.default.destinationOfSymbolicLink(atPath: fdDirectory + "/" + $0)
        }
        let fds = fdTargets.count
        let storeFDs = fdTargets.filter { $0.hasPrefix(data + "/stores/") }.count
        env.stop(daemon)
        let perStore = Double(storeFDs) / Double(max(openStores, 1))
        record(Measurement(scenario: "5. memory", subject: "RSS after touching \(count) users", value: rss / 1024, unit: "MiB",
                           note: "\(fds) open fds, \(storeFDs) of them on the \(openStores) open stores: \(format(perStore)) per store; \(Int(Double(names.count) / seconds)) opens/s over \(format(seconds)) s\(errors(failures))"))
        check(TargetCheck(target: "memory < 256 MiB RSS after \(count) users", measured: "\(format(rss / 1024)) MiB", met: rss / 1024 < 256))
        check(TargetCheck(target: "≤ 2 fds per open store", measured: format(perStore), met: perStore <= 2))
    }
}
