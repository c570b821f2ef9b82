import Foundation
import UserStoreClient

/// Scenario 3: how fast a new user's first request is served, migrated step by step and copied
/// from the template.
struct ColdOpenScenario: Scenario {
    let bench: Bench

    func run() async throws {
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
            record(Measurement(scenario: "3. cold open", subject: template ? "new store copied from the template (6 migrations)" : "new store + 6 example migrations, step by step",
                               value: rate, unit: "stores/s", p50: latencies.percentile(0.5), p99: latencies.percentile(0.99),
                               note: ratio + (failures == 0 ? "" : " \(failures) errors")))
        }
        let templated = p50[true] ?? .infinity
        check(TargetCheck(target: "cold open from the template: p50 < 1 ms", measured: "p50 \(format(templated)) µs", met: templated < 1000))
    }
}
