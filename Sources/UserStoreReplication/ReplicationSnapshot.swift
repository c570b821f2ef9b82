import Foundation

/// What `Status` and `userstorectl replication` show of replication.
package struct ReplicationSnapshot: Sendable {
    package var registered: Int
    package var unregistered: Int
    package var lastError: String?
    package var restored: Int
    package var replicaProblem: String?
    /// Log objects written since start.
    package var syncs: Int
    /// Per open store: its user, and whether its base is in the log.
    package var stores: [(user: String, registered: Bool)]
    /// With one host: whether this host holds the replica's writer lease (true without one).
    package var holdsLease: Bool
    /// The host log's state.
    package var log: LogState

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
}
