import ArgumentParser
import Foundation

/// `make bench`: every scenario against its baseline in the same run; a markdown table on
/// stdout and JSON (machine, versions, numbers, targets) in a file.
@main
struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "userstore-bench", abstract: "Benchmarks of userstored against its baselines.")

    @Option(help: "Seconds per measured run.")
    var seconds: Double = 5

    @Flag(help: "Smaller fleets and shorter runs (a smoke test of the benchmark itself).")
    var quick = false

    @Option(help: "Where the JSON results go (default: docs/bench/latest.json for a full run; .build/bench-partial.json when --quick, --only or a fleet option narrows it, so that a partial run never replaces the full run's record).")
    var json: String?

    @Option(help: "Only these scenarios (1-8), comma-separated.")
    var only: String = Self.allScenarios

    static let allScenarios = "1,2,3,4,5,6,7,8,9"
    static let allReleases = "additive,rebuild"
    static let allFileSystems = "root,ext4,xfs"

    @Option(help: "Stores per fleet-migration run (scenario 4; default 10000, 2000 with --quick).")
    var fleetStores: Int?

    @Option(help: "The daemon's fleetParallelism for scenario 4 (default: the daemon's own default).")
    var fleetParallelism: Int?

    @Option(help: "Releases for scenario 4, comma-separated: additive, rebuild (default both).")
    var fleetReleases = Self.allReleases

    @Option(help: "File systems for scenario 4, comma-separated: root, ext4, xfs (default all three).")
    var fileSystems = Self.allFileSystems

    @Option(help: "The repository (for config/migrations).")
    var repository = FileManager.default.currentDirectoryPath

    func run() async throws {
        let binaries = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path
        let root = NSTemporaryDirectory() + "userstore-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        chmod(root, 0o755)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let bench = Bench(env: BenchEnvironment(root: root, binaries: binaries, repository: repository), seconds: quick ? 2 : seconds,
                          quick: quick, load: LoadGenerator.available(in: binaries))
        let fleet = FleetMigrationScenario(bench: bench, fleetStores: fleetStores, fleetParallelism: fleetParallelism,
                                           fleetReleases: Set(fleetReleases.split(separator: ",").map(String.init)),
                                           fileSystems: Set(fileSystems.split(separator: ",").map(String.init)))
        let scenarios: [(String, any Scenario)] = [
            ("1", PointQueryScenario(bench: bench)), ("2", DurableWriteScenario(bench: bench)), ("3", ColdOpenScenario(bench: bench)),
            ("4", fleet), ("5", MemoryScenario(bench: bench)), ("6", TransactionScenario(bench: bench)),
            ("7", ReplicationScenario(bench: bench)), ("8", ObjectStoreScenario(bench: bench)), ("9", EncryptionScenario(bench: bench)),
        ]
        let selected = Set(only.split(separator: ",").map(String.init))
        for (number, scenario) in scenarios where selected.contains(number) { try await scenario.run() }
        let report = bench.report

        let machine = machineInfo()
        var lines = ["| scenario | subject | result | p50 | p99 | note |", "|---|---|---|---|---|---|"]
        for m in report.measurements {
            lines.append("| \(m.scenario) | \(m.subject) | \(format(m.value)) \(m.unit) | \(m.p50.map { format($0) + " µs" } ?? "") | \(m.p99.map { format($0) + " µs" } ?? "") | \(m.note) |")
        }
        lines += ["", "| target | this run | met |", "|---|---|---|"]
        for t in report.targets { lines.append("| \(t.target) | \(t.measured) | \(t.met ? "yes" : "**no**") |") }
        lines += ["", "Machine: \(machine["cpu"] ?? "?"), \(machine["cores"] ?? "?") cores, \(machine["memory"] ?? "?"); \(machine["sqlite"] ?? ""); \(machine["postgres"] ?? ""); \(quick ? "quick mode" : "\(seconds) s per run")."]
        print(lines.joined(separator: "\n"))

        let object: [String: Any] = [
            "machine": machine, "quick": quick, "secondsPerRun": quick ? 2 : seconds,
            "measurements": report.measurements.map(\.json),
            "targets": report.targets.map { ["target": $0.target, "measured": $0.measured, "met": $0.met] },
        ]
        let narrowed = quick || only != Self.allScenarios || fleetStores != nil || fleetParallelism != nil
            || fleetReleases != Self.allReleases || fileSystems != Self.allFileSystems
        let json = self.json ?? (narrowed ? ".build/bench-partial.json" : "docs/bench/latest.json")
        try FileManager.default.createDirectory(atPath: URL(fileURLWithPath: json).deletingLastPathComponent().path, withIntermediateDirectories: true)
        try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]).write(to: URL(fileURLWithPath: json))
        log("results written to \(json)")
    }

    func machineInfo() -> [String: String] {
        let cpu = shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").1.trimmingCharacters(in: .whitespacesAndNewlines)
        let memory = shell("free -h | awk '/Mem:/ {print $2}'").1.trimmingCharacters(in: .whitespacesAndNewlines)
        return [
            "cpu": cpu, "cores": "\(ProcessInfo.processInfo.activeProcessorCount)", "memory": memory,
            "kernel": shell("uname -r").1.trimmingCharacters(in: .whitespacesAndNewlines),
            "swift": shell("swift --version 2>&1 | head -1").1.trimmingCharacters(in: .whitespacesAndNewlines),
            "sqlite": "SQLite " + shell("sqlite3 --version | cut -d' ' -f1").1.trimmingCharacters(in: .whitespacesAndNewlines),
            "postgres": shell("/usr/lib/postgresql/15/bin/postgres --version 2>/dev/null").1.trimmingCharacters(in: .whitespacesAndNewlines),
        ]
    }
}
