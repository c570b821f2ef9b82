import Foundation
import ServiceLifecycle
import UserStoreCore

/// Replication's two loops: every second, checks Litestream, registers the open stores it lacks
/// and compares those it replicates again after a fault with their replica
/// (``LitestreamReplicator/checkHealth()``, ``ReplicaCheck``); every quarter sync interval, syncs
/// the stores written since the last pass (``LitestreamReplicator/syncWrittenStores()``).
///
/// With Litestream as the daemon's child, one that has not answered for
/// `replication.restartUnresponsiveSeconds` is killed (the supervisor starts a new one): while it
/// lives it holds the WAL positions of the stores it replicated, so their WALs could not be
/// checkpointed and would grow without end.
package struct ReplicationMonitor: Service {
    package let replicator: LitestreamReplicator
    package let registry: StoreRegistry
    /// The child (`replication.startLitestream`); nil when Litestream runs on its own.
    package let litestream: LitestreamProcess?

    package init(replicator: LitestreamReplicator, registry: StoreRegistry, litestream: LitestreamProcess?) {
        self.replicator = replicator
        self.registry = registry
        self.litestream = litestream
    }

    package func run() async throws {
        let replicator = self.replicator
        // A quarter: the pass itself and Litestream's sync must fit in the rest of the interval.
        let period = Duration.milliseconds(max(25, replicator.settings.syncIntervalMilliseconds / 4))
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await replicator.loadReplicaIndex() }
            group.addTask {
                var checked = 0
                var killed: pid_t = 0
                var round = 0
                while !Task.isShuttingDownGracefully && !Task.isCancelled {
                    // The replica itself every 5 s (a request to the bucket), every second while it fails.
                    if round % 5 == 0 || replicator.snapshot.replicaProblem != nil { await replicator.checkReplica() }
                    round += 1
                    let replicating = await replicator.checkHealth()
                    // Not while the replica itself is out of reach: every comparison would fail.
                    if replicator.snapshot.replicaProblem == nil { checked += await compare(replicating) }
                    if replicator.everyStoreRegistered {
                        replicator.recovered(checked: checked)
                        checked = 0
                    }
                    killed = killIfUnresponsive(alreadyKilled: killed)
                    try? await Task.sleep(for: .seconds(1))
                }
            }
            group.addTask {
                // The loss window is at most the sync interval while every pass takes at most half
                // of it (a write waits for the next pass's start, then for that pass).
                let budget = Duration.milliseconds(replicator.settings.syncIntervalMilliseconds / 2)
                var warned: ContinuousClock.Instant?
                while !Task.isShuttingDownGracefully && !Task.isCancelled {
                    let started = ContinuousClock.now
                    let took = await replicator.syncWrittenStores()
                    if took > budget, warned.map({ ContinuousClock.now - $0 > .seconds(60) }) ?? true {
                        warned = .now
                        replicator.logger.warning("a sync pass took \(took), more than half of replication.syncIntervalMilliseconds: plain writes acknowledged up to \(took * 2) ago may not be in the replica yet", metadata: [
                            "event": "replication-sync-slow", "duration_usec": .stringConvertible(took.wholeMicroseconds),
                        ])
                    }
                    try? await Task.sleep(until: started + period)
                }
            }
        }
    }

    /// Compares the stores registered again after a fault with their replicas, four at a time;
    /// each that matches counts as registered again. Returns how many matched.
    private func compare(_ stores: [Store]) async -> Int {
        let check = ReplicaCheck(replicator: replicator, registry: registry)
        return await withTaskGroup(of: Bool.self) { group in
            var matched = 0
            for (index, store) in stores.enumerated() {
                if index >= 4, let done = await group.next(), done { matched += 1 }
                group.addTask {
                    guard await check.run(store) else { return false }
                    replicator.verified(store)
                    return true
                }
            }
            for await done in group where done { matched += 1 }
            return matched
        }
    }

    /// Kills the child when it has not answered for the configured time; returns the pid killed
    /// (once per process).
    private func killIfUnresponsive(alreadyKilled: pid_t) -> pid_t {
        let limit = replicator.settings.restartUnresponsiveSeconds
        guard let litestream, limit > 0, let since = replicator.unansweredSince,
              ContinuousClock.now - since > .seconds(limit) else { return alreadyKilled }
        let pid = litestream.pid
        guard pid > 0, pid != alreadyKilled else { return alreadyKilled }
        litestream.killUnresponsive(reason: "it has not answered on its control socket for \(limit) s")
        return pid
    }
}
