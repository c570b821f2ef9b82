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

/// Runs a command; returns (status, stdout+stderr).
@discardableResult
func shell(_ command: String, environment: [String: String] = [:]) -> (Int32, String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/bash")
    process.arguments = ["-c", command]
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    process.environment = env
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try! process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}

func log(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}
