import Foundation
import Logging
import ServiceLifecycle
import UserStoreConfiguration
import UserStoreCore

/// The engine as the daemon starts and runs it (``ReplicationEngine``).
extension LitestreamReplicator {
    /// Refuses to start (exit 69) without the `litestream` binary: the daemon could not tell a
    /// new user from a lost one.
    package static func checkBinary(_ settings: ReplicationSettings) throws(ReplicaSetup.Refusal) {
        guard access(LitestreamCommand.resolve(settings.litestream), X_OK) == 0 else {
            throw ReplicaSetup.Refusal(code: .unavailable, description: "replication.litestream: \(settings.litestream) is not an executable; install Litestream 0.5.17 (scripts/install-deps.sh)", name: nil)
        }
    }

    /// The engine on `setup`'s replica, its Litestream child started (when
    /// `replication.startLitestream`) and asked once which stores it holds, before the first
    /// store opens.
    package static func start(_ settings: ReplicationSettings, setup: ReplicaSetup, layout: StoreLayout, runtimeDirectory: String,
                              fencing: (any ReplicaFencing)?, logger: Logger,
                              syncDuration: (@Sendable (Duration) -> Void)?) async -> LitestreamReplicator {
        let child = settings.startLitestream
            ? LitestreamProcess(settings: settings, environment: setup.storage.litestreamEnvironment, runtimeDirectory: runtimeDirectory, logger: logger)
            : nil
        let replicator = LitestreamReplicator(settings: settings, storage: setup.storage, layout: layout, logger: logger, fencing: fencing,
                                              identity: setup.identity, lease: setup.lease, process: child, syncDuration: syncDuration)
        if let problem = setup.problem { replicator.replicaFailed(problem) }
        if let child {
            do {
                try await child.start()
            } catch {
                // Served degraded; the monitor registers the stores once it answers.
                logger.error("\(error)", metadata: ["event": "replication-degraded"])
            }
        }
        _ = await replicator.checkHealth()
        return replicator
    }

    package var indexedUsers: Int? { replicaIndex.count }

    package func replicaURL(for user: UserID) -> String { locations.replicaURL(for: user) }

    package func replicaFailed(_ problem: String) { replicaFailed(Problem(description: problem)) }

    package func services(registry: StoreRegistry) -> [any Service] {
        [ReplicationMonitor(replicator: self, registry: registry, litestream: process)]
    }

    package func stop() async { await process?.stop() }

    /// Litestream's final sync of a closing store is not tracked: what it committed is taken as
    /// stored (the log engine waits for it; Litestream is being retired, docs/replication.md).
    package func lastCommitsStored(until deadline: ContinuousClock.Instant) async -> Bool { true }
}
