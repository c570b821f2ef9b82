import Foundation
import UserStoreClient

extension Scenarios {
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
                        let rows = try? await store.query(Self.pointQuery, random.below(10_000) + 1)
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
