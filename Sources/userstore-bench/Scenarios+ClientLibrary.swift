import Foundation
import Synchronization
import UserStoreClient

extension Scenarios {
    /// Point queries through UserStoreClient (the library applications import): `connections`
    /// tasks, each waiting for its reply before the next call, on a pool of `connections` — the
    /// same load the C client puts on at `connections` connections (pipeline 1).
    func clientLibraryRun(connections: Int, seconds: Double, socket: String, users: [String]) async -> (throughput: Double, latencies: Latencies, errors: Int) {
        let client = UserStoreClient(configuration: {
            var configuration = UserStoreClient.Configuration(socketPath: socket)
            configuration.connections = connections
            return configuration
        }())
        defer { Task { await client.shutdown() } }
        let start = ContinuousClock.now
        let end = start + .milliseconds(Int(seconds * 1000))
        let results = await withTaskGroup(of: ([UInt64], Int).self) { group in
            for index in 0..<connections {
                group.addTask {
                    var random = FastRandom(state: UInt64(index + 1) * 6_700_417)
                    var samples: [UInt64] = []
                    samples.reserveCapacity(200_000)
                    var errors = 0
                    while ContinuousClock.now < end {
                        let store = client.store(for: users[random.below(users.count)])
                        let before = DispatchTime.now().uptimeNanoseconds
                        do {
                            let rows = try await store.query(Self.pointQuery, random.below(10_000) + 1)
                            if rows.count != 1 { errors += 1 }
                        } catch {
                            errors += 1
                        }
                        samples.append(DispatchTime.now().uptimeNanoseconds - before)
                    }
                    return (samples, errors)
                }
            }
            return await group.reduce(into: ([UInt64](), 0)) { total, part in
                total.0.append(contentsOf: part.0)
                total.1 += part.1
            }
        }
        let elapsed = Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds)
        return (Double(results.0.count) / max(elapsed, 0.001), Latencies(samples: results.0), results.1)
    }
}
