import Foundation
import Logging
import Synchronization
import UserStoreConfiguration

/// `litestream replicate` as the daemon's child (`replication.startLitestream`), with a
/// configuration that only opens the control socket: stores are registered through it.
///
/// One supervisor thread starts it, waits for it and starts it again a second after it ends,
/// until ``stop()``. The thread lives as long as the child does, and the child is started tied
/// to it (``LitestreamCommand``): when the daemon dies, however it dies, the kernel kills
/// Litestream too — an orphaned Litestream would go on shipping stores nobody owns any more.
package final class LitestreamProcess: Sendable {
    private let settings: ReplicationSettings
    private let configurationPath: String
    private let logger: Logger
    private let command: LitestreamCommand
    private let state = Mutex(State())

    private struct State {
        var pid: pid_t = 0
        var stopping = false
        /// Resumed by the supervisor thread as it ends.
        var ended: [CheckedContinuation<Void, Never>] = []
        var supervisorRunning = false
    }

    package init(settings: ReplicationSettings, environment: [String: String], runtimeDirectory: String, logger: Logger) {
        self.settings = settings
        self.configurationPath = runtimeDirectory + "/litestream.yml"
        self.logger = logger
        self.command = LitestreamCommand(settings.litestream, environment: environment)
    }

    /// Writes the configuration, ends a Litestream a previous daemon left on the socket, and
    /// starts one; returns once it answers on its socket (or throws after 10 s).
    package func start() async throws {
        var yaml = "# Written by userstored: stores are registered through the control socket.\nsocket:\n  enabled: true\n  path: \"\(settings.socket)\"\n  permissions: 0600\n"
        // Its Prometheus page: the daemon reads what it sent to the bucket there (BucketTraffic).
        if let address = settings.litestreamMetricsAddress { yaml += "addr: \"\(address)\"\n" }
        try yaml.write(toFile: configurationPath, atomically: true, encoding: .utf8)
        let control = LitestreamControl(socketPath: settings.socket)
        if let orphan = try? await control.info(), orphan.pid > 0 {
            // Only a previous userstored on this data directory (whose lock we hold) starts one here.
            logger.notice("ending the Litestream (pid \(orphan.pid)) a previous daemon left running", metadata: ["event": "litestream-orphan"])
            kill(pid_t(orphan.pid), SIGTERM)
            for _ in 0..<100 where kill(pid_t(orphan.pid), 0) == 0 { try await Task.sleep(for: .milliseconds(100)) }
        }
        state.withLock { $0.supervisorRunning = true }
        let supervisor = Thread { [self] in supervise() }
        supervisor.name = "userstore-litestream"
        supervisor.start()
        try await waitUntilAnswering(control)
    }

    /// Stops Litestream (SIGTERM: it finishes its syncs; SIGKILL after 30 s) and waits for it
    /// to exit.
    package func stop() async {
        let pid = state.withLock { state -> pid_t in
            state.stopping = true
            return state.pid
        }
        if pid > 0 { kill(pid, SIGTERM) }
        let killer = Task {
            try? await Task.sleep(for: .seconds(30))
            let pid = self.pid
            if pid > 0 { kill(pid, SIGKILL) }
        }
        await withCheckedContinuation { (ended: CheckedContinuation<Void, Never>) in
            let running = state.withLock { state -> Bool in
                if state.supervisorRunning { state.ended.append(ended) }
                return state.supervisorRunning
            }
            if !running { ended.resume() }
        }
        killer.cancel()
    }

    /// Kills a Litestream that stopped answering (SIGKILL: a hung process may not act on
    /// SIGTERM); the supervisor starts a new one a second later.
    package func killUnresponsive(reason: String) {
        let pid = self.pid
        guard pid > 0 else { return }
        logger.error("killing litestream (pid \(pid)): \(reason); a new one starts in a second", metadata: [
            "event": "litestream-unresponsive", "pid": .stringConvertible(pid), "error": .string(reason),
        ])
        kill(pid, SIGKILL)
    }

    /// The child's process id (0 when not running).
    package var pid: pid_t { state.withLock { $0.pid } }

    /// Runs on the supervisor thread: start, wait, start again a second after an exit.
    private func supervise() {
        defer {
            let ended = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.supervisorRunning = false
                defer { state.ended = [] }
                return state.ended
            }
            for continuation in ended { continuation.resume() }
        }
        while !state.withLock({ $0.stopping }) {
            let child: pid_t
            do {
                // Its log lines go where the daemon's stderr goes (the journal under systemd).
                child = try command.spawn(["replicate", "-config", configurationPath])
            } catch {
                logger.error("cannot start \(settings.litestream) replicate: \(error)", metadata: ["event": "litestream-exited"])
                if pause() { return } else { continue }
            }
            let stopped = state.withLock { state -> Bool in
                state.pid = child
                return state.stopping
            }
            // stop() ran while this one started: it must not outlive the daemon's stop either.
            if stopped { kill(child, SIGTERM) }
            logger.notice("started litestream replicate (pid \(child))", metadata: [
                "event": "litestream-started", "pid": .stringConvertible(child),
            ])
            let status = LitestreamCommand.reap(child) ?? -1
            let stopping = state.withLock { state -> Bool in
                state.pid = 0
                return state.stopping
            }
            if stopping { return }
            logger.error("litestream exited (status \(status)); starting it again", metadata: [
                "event": "litestream-exited", "status": .stringConvertible(status),
            ])
            if pause() { return }
        }
    }

    /// Waits a second before the next start; returns whether the daemon is stopping meanwhile.
    private func pause() -> Bool {
        for _ in 0..<20 {
            if state.withLock({ $0.stopping }) { return true }
            usleep(50_000)
        }
        return state.withLock { $0.stopping }
    }

    private func waitUntilAnswering(_ control: LitestreamControl) async throws {
        for _ in 0..<100 {
            if (try? await control.info()) != nil { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw LitestreamControl.Failure(description: "litestream replicate did not answer on \(settings.socket)")
    }
}
