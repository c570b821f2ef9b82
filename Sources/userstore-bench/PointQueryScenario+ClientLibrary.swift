import Foundation
import UserStoreClient

extension PointQueryScenario {
    /// UserStoreClient against the C client on the same load, alternating three times (C, the
    /// library with its tasks on Swift's global executor, and on `client.executor`): this
    /// machine's speed drifts by a third from one run to the next, and a ratio of two single
    /// runs measured that drift as much as the clients. Rows give the means and every run.
    func compareClientLibrary(connections: Int, socket: String, users: [String], load: LoadGenerator,
                                       workload: LoadGenerator.Workload, scenario: String) async {
        let plural = connections == 1 ? "" : "s"
        var c: [LoadGenerator.Result] = []
        var library: [Bool: [(throughput: Double, latencies: Latencies, errors: Int, clientCPU: Double)]] = [false: [], true: []]
        // The order turns each round (C first, then second, then third), so that a drift within
        // a round favours no one.
        for round in 0..<3 {
            for slot in 0..<3 {
                switch (slot + round) % 3 {
                case 0: c.append(load.run(socket: socket, connections: connections, seconds: seconds, workload))
                case let which:
                    let onClientExecutor = which == 2
                    library[onClientExecutor]!.append(await clientLibraryRun(connections: connections, seconds: seconds, socket: socket,
                                                                             users: users, onClientExecutor: onClientExecutor))
                }
            }
        }
        func mean(_ values: [Double]) -> Double { values.reduce(0, +) / Double(max(values.count, 1)) }
        let cMean = mean(c.map(\.throughput))
        record(Measurement(scenario: scenario, subject: "userstored, C client, \(connections) connection\(plural) (mean of 3, alternating with UserStoreClient)",
                           value: cMean, unit: "req/s", p50: mean(c.map(\.p50)), p99: mean(c.map(\.p99)),
                           note: "runs " + c.map { format($0.throughput) }.joined(separator: ", ")
                               + "; client CPU \(format(mean(c.map(\.clientCPU)))) µs/request" + errors(c.map(\.errors).reduce(0, +))))
        for onClientExecutor in [false, true] {
            let runs = library[onClientExecutor]!
            let throughput = mean(runs.map(\.throughput))
            let ratio = throughput / max(cMean, 1)
            let executor = onClientExecutor ? "tasks on client.executor" : "tasks on the global executor"
            record(Measurement(scenario: scenario, subject: "userstored, UserStoreClient (Swift library, \(executor)), \(connections) connection\(plural) (mean of 3)",
                               value: throughput, unit: "req/s", p50: mean(runs.map { $0.latencies.percentile(0.5) }),
                               p99: mean(runs.map { $0.latencies.percentile(0.99) }),
                               note: String(format: "%.2f× the C client; runs %@; client CPU %@ µs/request", ratio,
                                            runs.map { format($0.throughput) }.joined(separator: ", "), format(mean(runs.map(\.clientCPU))))
                                   + errors(runs.map(\.errors).reduce(0, +))))
            if connections == 8 {
                check(TargetCheck(target: "UserStoreClient (\(executor)) ≥ 0.8× the C client at 8 connections (\(users.count) users)",
                                  measured: String(format: "%.2f×", ratio), met: ratio >= 0.8))
            }
        }
    }

    /// Point queries through UserStoreClient (the library applications import): `connections`
    /// tasks, each waiting for its reply before the next call, on a pool of `connections` — the
    /// same load the C client puts on at `connections` connections (pipeline 1). `onClientExecutor`:
    /// the tasks run on `client.executor` (the thread that reads the replies) instead of Swift's
    /// global executor. `clientCPU`: this process's CPU per request meanwhile.
    func clientLibraryRun(connections: Int, seconds: Double, socket: String, users: [String],
                          onClientExecutor: Bool) async -> (throughput: Double, latencies: Latencies, errors: Int, clientCPU: Double) {
        var configuration = UserStoreClient.Configuration(socketPath: socket)
        configuration.connections = connections
        let client = UserStoreClient(configuration: configuration)
        let cpuBefore = cpuMicroseconds(of: getpid())
        let begin = nanoseconds()
        let end = begin + UInt64(seconds * 1e9)
        let (samples, errors) = await withTaskGroup(of: ([UInt64], Int).self) { group in
            for index in 0..<connections {
                group.addTask(executorPreference: onClientExecutor ? client.executor : nil) {
                    var random = FastRandom(state: UInt64(index + 1) * 6_700_417)
                    var samples: [UInt64] = []
                    samples.reserveCapacity(200_000)
                    var errors = 0
                    while nanoseconds() < end {
                        let store = client.store(for: users[random.below(users.count)])
                        let sent = nanoseconds()
                        let rows = try? await store.query(Bench.pointQuery, random.below(10_000) + 1)
                        if rows?.count != 1 { errors += 1 }
                        samples.append(nanoseconds() - sent)
                    }
                    return (samples, errors)
                }
            }
            return await group.reduce(into: ([UInt64](), 0)) { total, part in
                total.0.append(contentsOf: part.0)
                total.1 += part.1
            }
        }
        let elapsed = Double(nanoseconds() - begin) / 1e9
        let cpu = (cpuMicroseconds(of: getpid()) - cpuBefore) / Double(max(samples.count, 1))
        await client.shutdown()
        return (Double(samples.count) / elapsed, Latencies(samples: samples), errors, cpu)
    }
}
