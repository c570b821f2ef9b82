import Foundation
import Testing
import Varlink

/// A real `userstored` process on a temporary data directory, configuration and socket.
/// Start-up is synchronised on the daemon's own READY=1 (through a NOTIFY_SOCKET the test owns).
public final class DaemonHarness {
    public let directory: TemporaryDirectory
    public let socketPath: String
    public let configPath: String
    public let dataDirectory: String
    public let migrationsDirectory: String
    public let notify: NotifySocket
    public private(set) var process: Process?
    public private(set) var stderrPath: String
    /// Variables every start adds to the daemon's environment (S3 credentials, say).
    public var environment: [String: String] = [:]
    /// What lives as long as this daemon (its replica's folder, say: a test that drops its own
    /// reference must not remove the replica under the daemon).
    public var retained: [AnyObject] = []

    /// Writes the migrations and a configuration (`extraConfig` is appended YAML).
    public init(migrations: [String: String]? = nil, extraConfig: String = "", appVersion: String = "2.0.0") throws {
        directory = try TemporaryDirectory()
        chmod(directory.path, 0o755)
        socketPath = directory.path + "/run/userstore.sock"
        configPath = directory.path + "/userstored.yaml"
        dataDirectory = directory.path + "/data"
        migrationsDirectory = directory.path + "/migrations"
        stderrPath = directory.path + "/stderr.log"
        try FileManager.default.createDirectory(atPath: migrationsDirectory, withIntermediateDirectories: true)
        if let migrations {
            for (name, sql) in migrations { try sql.write(toFile: migrationsDirectory + "/" + name, atomically: true, encoding: .utf8) }
        } else {
            for name in try FileManager.default.contentsOfDirectory(atPath: repositoryRoot + "/config/migrations") {
                try FileManager.default.copyItem(atPath: repositoryRoot + "/config/migrations/" + name, toPath: migrationsDirectory + "/" + name)
            }
        }
        notify = try NotifySocket(path: directory.path + "/notify.sock")
        try writeConfig(appVersion: appVersion, extra: extraConfig)
    }

    /// (Re)writes the configuration; `dataDirectory` and `socketPath` default to this harness's
    /// own (another daemon's, to make two collide).
    public func writeConfig(appVersion: String = "2.0.0", dataDirectory: String? = nil, socketPath: String? = nil, extra: String = "") throws {
        try """
            appVersion: "\(appVersion)"
            dataDirectory: \(dataDirectory ?? self.dataDirectory)
            socketPath: \(socketPath ?? self.socketPath)
            migrationsDirectory: \(migrationsDirectory)
            logTarget: stderr
            \(extra)
            """.write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    /// Writes another migration file.
    public func addMigration(_ name: String, _ sql: String) throws {
        try sql.write(toFile: migrationsDirectory + "/" + name, atomically: true, encoding: .utf8)
    }

    /// Starts the daemon and waits for READY=1. `launcher` prefixes the command (e.g. the
    /// socket-activation helper).
    public func start(environment: [String: String] = [:], launcher: [String] = [], waitForReady: Bool = true) throws {
        let readyBefore = notify.lines.filter { $0 == "READY=1" }.count
        let process = Process()
        let daemon = productsDirectory + "/userstored"
        let command = launcher + [daemon, "--config", configPath]
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        var env = ProcessInfo.processInfo.environment
        env["NOTIFY_SOCKET"] = notify.path
        for (key, value) in self.environment { env[key] = value }
        for (key, value) in environment { env[key] = value }
        process.environment = env
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        process.standardError = FileHandle(forWritingAtPath: stderrPath)
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        self.process = process
        if waitForReady {
            let notify = self.notify
            let ready = notify.waitFor { _ in notify.lines.filter { $0 == "READY=1" }.count > readyBefore }
            if !ready { Issue.record("the daemon did not become ready; stderr:\n\(stderr)") }
        }
    }

    /// The daemon's pid; with no daemon running, one no process has (never 0 or -1: `kill` with
    /// those signals the caller's process group, or every process).
    public var pid: Int32 { process?.processIdentifier ?? Int32.max }

    /// What the daemon wrote on stderr.
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Sends `signal` and waits for the exit; returns the exit status.
    @discardableResult
    public func stop(signal: Int32 = SIGTERM) -> Int32 {
        guard let process else { return -1 }
        if process.isRunning { kill(process.processIdentifier, signal) }
        process.waitUntilExit()
        self.process = nil
        return process.terminationStatus
    }

    /// Sends `signal` and waits at most `limit` for the daemon to exit: its exit status, or nil
    /// when it had not exited by then (it is SIGKILLed, so that no test is left waiting).
    public func stop(signal: Int32 = SIGTERM, within limit: Duration) -> Int32? {
        guard let process else { return -1 }
        let running = process
        let exited = DispatchSemaphore(value: 0)
        Thread {
            running.waitUntilExit()
            exited.signal()
        }.start()
        if process.isRunning { kill(process.processIdentifier, signal) }
        let inTime = exited.wait(timeout: .now() + .milliseconds(Int(limit / .milliseconds(1)))) == .success
        if !inTime {
            kill(process.processIdentifier, SIGKILL)
            exited.wait()
        }
        self.process = nil
        return inTime ? process.terminationStatus : nil
    }

    /// Waits for the daemon to exit on its own.
    @discardableResult
    public func waitForExit() -> Int32 {
        guard let process else { return -1 }
        process.waitUntilExit()
        self.process = nil
        return process.terminationStatus
    }

    /// A new client connection (with a receive timeout, so a test never hangs).
    public func connect() throws -> VarlinkConnection {
        let connection = try VarlinkConnection(path: socketPath)
        connection.setReceiveTimeout(seconds: 60)
        return connection
    }

    /// The daemon's resident memory in KiB (VmRSS).
    public var residentKiB: Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
    }

    deinit {
        if let process, process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// Runs a program and returns (exit status, stdout, stderr).
@discardableResult
public func run(_ command: [String], environment: [String: String] = [:], input: String? = nil) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: command[0])
    process.arguments = Array(command.dropFirst())
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    process.environment = env
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    if let input {
        let pipe = Pipe()
        process.standardInput = pipe
        try process.run()
        pipe.fileHandleForWriting.write(Data(input.utf8))
        try pipe.fileHandleForWriting.close()
    } else {
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }
    // Read both pipes at once before waiting, so a large output on either never blocks the child.
    final class Box: @unchecked Sendable { var data = Data() } // written once by the reader thread, read after wait()
    let errBox = Box()
    let done = DispatchSemaphore(value: 0)
    DispatchQueue.global().async { errBox.data = err.fileHandleForReading.readDataToEndOfFile(); done.signal() }
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    done.wait()
    let errData = errBox.data
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self))
}
