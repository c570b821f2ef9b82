import Foundation

/// The C load generator (bench/userstore-load.c, built by scripts/bench.sh next to this
/// binary): as lean a client as pgbench, so that a ratio against pgbench compares the servers,
/// not the clients.
struct LoadGenerator {
    let path: String

    struct Result {
        var requests: Int
        var errors: Int
        var throughput: Double
        var p50: Double
        var p99: Double
        /// The generator's own CPU time per request, in µs.
        var clientCPU: Double
    }

    /// What to send: a method and SQL; with `rows` > 0, a random id in 1...rows is the one parameter.
    struct Workload {
        var method = "io.userstore.Store.Query"
        var sql = Bench.pointQuery
        var rows = 10_000
        var users: Int
        /// Each connection uses the user of its own index instead of a random one.
        var userPerConnection = false
    }

    static func available(in directory: String) -> LoadGenerator? {
        let path = directory + "/userstore-load"
        return FileManager.default.isExecutableFile(atPath: path) ? LoadGenerator(path: path) : nil
    }

    /// Drives `socket` with `connections` connections from two threads, `pipeline` calls in
    /// flight on each, for `seconds`.
    func run(socket: String, connections: Int, pipeline: Int = 1, seconds: Double, extra: [String] = [], _ workload: Workload) -> Result {
        let arguments = [path, "--socket", socket, "--connections", "\(connections)", "--threads", "2", "--seconds", "\(seconds)",
                         "--pipeline", "\(pipeline)", "--users", "\(workload.users)", "--pick", workload.userPerConnection ? "connection" : "random",
                         "--method", workload.method, "--sql", workload.sql, "--rows", "\(workload.rows)"] + extra
        let (status, output) = shell(arguments.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " "))
        guard status == 0, let line = output.split(separator: "\n").last,
              let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            log("userstore-load failed (\(status)): \(output)")
            return Result(requests: 0, errors: 1, throughput: 0, p50: 0, p99: 0, clientCPU: 0)
        }
        func number(_ key: String) -> Double { (object[key] as? NSNumber)?.doubleValue ?? 0 }
        return Result(requests: Int(number("requests")), errors: Int(number("errors")), throughput: number("throughput"),
                      p50: number("p50_us"), p99: number("p99_us"), clientCPU: number("client_cpu_us_per_request"))
    }
}
