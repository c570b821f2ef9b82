import Foundation

/// What `Status` and `userstorectl replication` show of replication.
package struct ReplicationSnapshot: Sendable {
    package var registered: Int
    package var unregistered: Int
    package var lastError: String?
    package var litestreamPID: Int
    package var litestreamVersion: String
    package var restored: Int
    package var diverged: Int
    package var lastSyncPassSeconds: Double
    package var longestSyncPassSeconds: Double
    package var replicaProblem: String?
    /// Syncs asked of Litestream since start, and durable waits answered by a sync another
    /// caller had queued (``SyncLanes``: group commit).
    package var syncs: Int
    package var sharedSyncWaits: Int
    /// Per open store: its user, whether it is registered, its last sync.
    package var stores: [(user: String, registered: Bool, lastSync: Date?)]
    /// With one host: whether this host holds the replica's writer lease (true without one).
    package var holdsLease: Bool
    /// The host log's state (`replication.engine: log`; nil with Litestream).
    package var log: LogState? = nil

    /// What the host log shows operators (the `userstore_replication_log_*` metrics).
    package struct LogState: Sendable, Equatable {
        /// Log objects in the bucket not yet folded (0 until the log is listed).
        package var tailObjects: Int
        /// How long the oldest record not yet stored has waited (0: none waits).
        package var oldestUnstoredSeconds: Double
        /// Bytes of records waiting to be written.
        package var pendingBytes: Int
        /// Log objects written, and log objects folded into per-user objects, since start.
        package var objectsWritten: Int
        package var objectsFolded: Int
        /// Why the last fold failed, while it fails.
        package var foldError: String?
    }
    package var degraded: Bool { unregistered > 0 || lastError != nil || replicaProblem != nil || !holdsLease }
    /// The longest time since Litestream last synced an open, registered store.
    package var maxLagSeconds: Double {
        let now = Date()
        return stores.filter(\.registered).compactMap { $0.lastSync.map { now.timeIntervalSince($0) } }.max() ?? 0
    }
}
