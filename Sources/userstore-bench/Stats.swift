import Foundation

/// Monotonic nanoseconds.
@inline(__always)
func nanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}

/// Latencies in nanoseconds, summarised.
struct Latencies {
    var samples: [UInt64]

    func percentile(_ p: Double) -> Double {
        guard !samples.isEmpty else { return 0 }
        let sorted = samples.sorted()
        let index = min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.down)))
        return Double(sorted[index]) / 1000 // microseconds
    }
}

/// One measured line of the report.
struct Measurement {
    var scenario: String
    var subject: String
    var value: Double
    var unit: String
    var p50: Double? = nil
    var p99: Double? = nil
    var note: String = ""

    var json: [String: Any] {
        var object: [String: Any] = ["scenario": scenario, "subject": subject, "value": value, "unit": unit, "note": note]
        if let p50 { object["p50_us"] = p50 }
        if let p99 { object["p99_us"] = p99 }
        return object
    }
}

/// A target from the issue, checked against this run's numbers.
struct TargetCheck {
    var target: String
    var measured: String
    var met: Bool
}

func format(_ value: Double) -> String {
    value >= 100 ? String(format: "%.0f", value) : value >= 10 ? String(format: "%.1f", value) : String(format: "%.2f", value)
}

/// Runs a shell command with posix_spawn and waitpid (Foundation's Process can miss the exit
/// of a child whose descendants daemonise, like pg_ctl's); returns (status, stdout+stderr).
@discardableResult
func shell(_ command: String, environment: [String: String] = [:]) -> (Int32, String) {
    let output = NSTemporaryDirectory() + "userstore-bench-shell-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
    let status = spawn("(\(command)) </dev/null >\(output) 2>&1", environment: environment)
    let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
    unlink(output)
    return (status, text)
}

/// A command that leaves a daemon behind (pg_ctl start): nothing captured.
func shellDetached(_ command: String) -> Int32 {
    spawn("(\(command)) </dev/null >/dev/null 2>&1", environment: [:])
}

private func spawn(_ command: String, environment: [String: String]) -> Int32 {
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    let arguments: [UnsafeMutablePointer<CChar>?] = ["/bin/bash", "-c", command].map { (text: String) in strdup(text) } + [nil]
    let variables: [UnsafeMutablePointer<CChar>?] = env.map { (entry: (key: String, value: String)) in strdup(entry.key + "=" + entry.value) } + [nil]
    defer {
        arguments.forEach { free($0) }
        variables.forEach { free($0) }
    }
    // A child must not inherit this process's blocked signals (pgbench -T waits for SIGALRM).
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var empty = sigset_t(), all = sigset_t()
    sigemptyset(&empty)
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attributes, &empty)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    var pid: pid_t = 0
    guard posix_spawn(&pid, "/bin/bash", nil, &attributes, arguments, variables) == 0 else { return -1 }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0, errno == EINTR {}
    return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
}

func log(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// CPU time (user + system) a process has used so far, in microseconds.
func cpuMicroseconds(of pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return 0 }
    // Fields after the command name: state is field 3, utime 14 and stime 15 (1-based).
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) * 1e6 / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// Runs `load` and returns its result with the CPU time `pid` used per request during it (µs).
func withCPU(of pid: Int32, _ load: () -> LoadGenerator.Result) -> (result: LoadGenerator.Result, cpuPerRequest: Double) {
    let before = cpuMicroseconds(of: pid)
    let result = load()
    return (result, (cpuMicroseconds(of: pid) - before) / Double(max(result.requests, 1)))
}
