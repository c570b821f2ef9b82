import Foundation
import ServiceLifecycle
import UserStoreConfiguration
import UserStoreCore

/// An engine that keeps the off-host copy of every store, as the daemon uses it: the registry's
/// ``StoreReplication`` (restore, open, close, replace), durable waits, what `Status` and the
/// metrics show, the operator's calls on the replica, and the engine's background work. Today's
/// engine drives Litestream (``LitestreamReplicator``); the replica's identity and writer lease
/// (``ReplicaSetup``) are shared by every engine.
package protocol ReplicationEngine: StoreReplication, AnyObject {
    /// `replication.*`.
    var settings: ReplicationSettings { get }
    /// The replica's marker against this data directory's binding (nil for `sftp://`).
    var identity: ReplicaIdentity? { get }
    /// The writer lease, with one host (nil in a cluster and for `sftp://`).
    var lease: LeaseKeeper? { get }
    /// What `Status`, `userstorectl replication` and the metrics show.
    var snapshot: ReplicationSnapshot { get }
    /// How many users the engine's index of the bucket holds, once listed (nil: no index).
    var indexedUsers: Int? { get }
    /// What reached the bucket, counted where the engine can (nil: not counted).
    var bucketTraffic: BucketTraffic? { get }
    /// The durable time-out from now.
    var durableDeadline: ContinuousClock.Instant { get }

    /// Waits until every transaction committed to `user`'s store so far is in the replica, and
    /// may be acknowledged (``StoreError/replicationUnavailable(user:message:)`` otherwise), by
    /// `deadline`.
    func waitUntilReplicated(_ user: UserID, until deadline: ContinuousClock.Instant) async throws
    /// The epoch `user`'s open store replicates under (nil: none, or not open).
    func registeredEpoch(of user: UserID) -> Int64?
    /// Where `user`'s copy is in the replica (for operators).
    func replicaURL(for user: UserID) -> String
    /// The replica could not be reached or verified (at start: served degraded).
    func replicaFailed(_ problem: String)
    /// `userstorectl replication init`.
    func initializeReplica() async throws -> ReplicaMarker
    /// `userstorectl replication take-over`.
    func takeOverReplica() async throws -> (held: ReplicaLease, previous: ReplicaLease?)
    /// This host took the writer lease at `epoch`.
    func leaseAcquired(_ epoch: Int64)
    /// The engine's background work (health checks, sync passes), run with the daemon's
    /// services until shutdown.
    func services(registry: StoreRegistry) -> [any Service]
    /// After every store's final sync at shutdown: ends what the engine runs besides.
    func stop() async
    /// Whether what the stores closed so far committed is in the replica, waiting for it until
    /// `deadline` (a cluster releases a moving bucket only then).
    func lastCommitsStored(until deadline: ContinuousClock.Instant) async -> Bool
}
