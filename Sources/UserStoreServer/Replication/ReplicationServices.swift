import Foundation
import Logging
import ServiceLifecycle
import UserStoreConfiguration
import UserStoreCore

/// Replication's two loops: every second, checks Litestream and registers the open stores it
/// lacks (``LitestreamReplicator/reconcile()``); every quarter sync interval, syncs the stores
/// written since the last pass (``LitestreamReplicator/syncWrittenStores()``).
struct ReplicationMonitor: Service {
    let replicator: LitestreamReplicator

    func run() async throws {
        let replicator = self.replicator
        // A quarter: the pass itself and Litestream's sync must fit in the rest of the interval.
        let period = Duration.milliseconds(max(25, replicator.settings.syncIntervalMilliseconds / 4))
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                while !Task.isShuttingDownGracefully && !Task.isCancelled {
                    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                        Thread.detachNewThread { replicator.reconcile(); done.resume() }
                    }
                    try? await Task.sleep(for: .seconds(1))
                }
            }
            group.addTask {
                while !Task.isShuttingDownGracefully && !Task.isCancelled {
                    let started = ContinuousClock.now
                    await replicator.syncWrittenStores()
                    try? await Task.sleep(until: started + period)
                }
            }
        }
    }
}

/// `litestream replicate` as the daemon's child (`replication.startLitestream`), with a
/// configuration that only opens the control socket: stores are registered through it. Started
/// again a second after it dies; stopped after every store's final sync (``stop()``).
final class LitestreamProcess: @unchecked Sendable { // `process` and `stopping` are guarded by `lock`
    private let settings: ReplicationSettings
    private let configurationPath: String
    private let logger: Logger
    private let lock = NSLock()
    private var process: Process?
    private var stopping = false
    private var supervisor: Task<Void, Never>?

    init(settings: ReplicationSettings, runtimeDirectory: String, logger: Logger) {
        self.settings = settings
        self.configurationPath = runtimeDirectory + "/litestream.yml"
        self.logger = logger
    }

    /// Writes the configuration, ends a Litestream a previous daemon left on the socket, and
    /// starts one; returns once it answers on its socket (or throws after 10 s).
    func start() async throws {
        let yaml = "# Written by userstored: stores are registered through the control socket.\nsocket:\n  enabled: true\n  path: \"\(settings.socket)\"\n  permissions: 0600\n"
        try yaml.write(toFile: configurationPath, atomically: true, encoding: .utf8)
        let control = LitestreamControl(socketPath: settings.socket)
        if let orphan = try? await control.info(), orphan.pid > 0 {
            // Only a previous userstored on this data directory (whose lock we hold) starts one here.
            logger.notice("ending the Litestream (pid \(orphan.pid)) a previous daemon left running", metadata: ["event": "litestream-orphan"])
            kill(pid_t(orphan.pid), SIGTERM)
            for _ in 0..<100 where kill(pid_t(orphan.pid), 0) == 0 { try await Task.sleep(for: .milliseconds(100)) }
        }
        do {
            try launch()
        } catch {
            logger.error("\(error)", metadata: ["event": "litestream-exited"])
        }
        // Started again a second after it dies, also when this first start failed.
        supervisor = Task.detached { [self] in await supervise(control) }
        try await waitUntilAnswering(control)
    }

    /// Stops Litestream (SIGTERM: it finishes its syncs) and waits for it to exit.
    func stop() async {
        supervisor?.cancel()
        let running = lock.withLock { () -> Process? in
            stopping = true
            return process
        }
        guard let running, running.isRunning else { return }
        running.terminate()
        for _ in 0..<300 where running.isRunning { try? await Task.sleep(for: .milliseconds(100)) }
        if running.isRunning { kill(running.processIdentifier, SIGKILL) }
    }

    /// The child's process id (0 when not running).
    var pid: Int32 { lock.withLock { process?.isRunning == true ? process!.processIdentifier : 0 } }

    private func launch() throws {
        if lock.withLock({ stopping }) { return }
        let child = Process()
        child.executableURL = URL(fileURLWithPath: LitestreamReplicator.resolve(settings.litestream))
        child.arguments = ["replicate", "-config", configurationPath]
        // Its log lines go where the daemon's stderr goes (the journal under systemd).
        child.standardOutput = FileHandle.standardError
        child.standardError = FileHandle.standardError
        do {
            try child.run()
        } catch {
            throw LitestreamControl.Failure(description: "cannot start \(settings.litestream) replicate: \(error)")
        }
        let stopped = lock.withLock { () -> Bool in
            process = child
            return stopping
        }
        // stop() ran while this one started: it must not outlive the daemon.
        if stopped { child.terminate() }
        logger.notice("started litestream replicate (pid \(child.processIdentifier))", metadata: [
            "event": "litestream-started", "pid": .stringConvertible(child.processIdentifier),
        ])
    }

    private func waitUntilAnswering(_ control: LitestreamControl) async throws {
        for _ in 0..<100 {
            if (try? await control.info()) != nil { return }
            guard lock.withLock({ process?.isRunning }) == true else { break } // the supervisor starts it again
            try await Task.sleep(for: .milliseconds(100))
        }
        throw LitestreamControl.Failure(description: "litestream replicate did not answer on \(settings.socket)")
    }

    /// Starts Litestream again a second after it exits, until ``stop()``.
    private func supervise(_ control: LitestreamControl) async {
        while !Task.isCancelled {
            let child = lock.withLock { process }
            while child?.isRunning == true && !Task.isCancelled { try? await Task.sleep(for: .milliseconds(200)) }
            if Task.isCancelled || lock.withLock({ stopping }) { return }
            logger.error("litestream exited (status \(child?.terminationStatus ?? -1)); starting it again", metadata: [
                "event": "litestream-exited", "status": .stringConvertible(child?.terminationStatus ?? -1),
            ])
            try? await Task.sleep(for: .seconds(1))
            if Task.isCancelled || lock.withLock({ stopping }) { return }
            do {
                try launch()
            } catch {
                logger.error("\(error)", metadata: ["event": "litestream-exited"])
            }
        }
    }
}
