import Foundation

/// What the registry asks of an off-host copy of every store (the daemon's host log,
/// `LogReplicator`), at the points of a store's life where it matters.
///
/// Every synchronous method may block (the disk) and is called on ``BlockingPool`` threads,
/// never on an event loop or the cooperative pool; what asks the replica is async. None throws for a
/// replication outage: the store is served unreplicated (degraded) and registered again later;
/// only ``restore(_:to:timestamp:)``, ``newerCopy(of:path:)`` and ``storeErased(_:path:)``
/// refuse, because serving an empty store in place of a replicated one, or leaving a copy of a
/// deleted one, would lose or resurrect the user's data.
///
/// A registry with a replication installs a ``WALHook`` on each store's connection: every
/// commit is captured, and the replicator decides when the WAL is checkpointed (never past what
/// the replica holds).
public protocol StoreReplication: Sendable {
    /// Puts the replica's copy of `user`'s store at `path` (which does not exist) when the
    /// replica has one: its latest state, or its state at `timestamp`. Returns what was
    /// restored, or nil when the replica holds nothing for the user (before a store is created:
    /// a new store is then created as usual). Throws
    /// ``StoreError/replicationUnavailable(user:message:)`` when it cannot tell, and
    /// ``StoreError/replicaDamaged(user:message:)`` when the copy fails its integrity check;
    /// nothing is left at `path` then.
    func restore(_ user: UserID, to path: String, timestamp: Date?) async throws -> ReplicaRestore?

    /// `store` was opened and nothing has written to it yet — or, for a store just created,
    /// once its migration has run and nothing else has written to it (its first record is then
    /// the whole migrated store): start replicating it. When that fails (degraded), the
    /// replicator sets `store.wal.checkpointsItself` and registers the store when it can.
    func storeOpened(_ store: Store)

    /// The epoch of a copy in the replica newer than the local file at `path` — another host
    /// (a cluster's, or a take-over of the writer lease) wrote the user since this one did, or
    /// the file's epoch is unknown (no position beside it) and the replica holds the user; nil
    /// when the local file is current. Asked before any open of an existing file. Throws
    /// ``StoreError/replicationUnavailable(user:message:)`` when the replica cannot be asked
    /// (opening the local file then could serve a copy another host has moved past).
    func newerCopy(of user: UserID, path: String) async throws -> Int64?

    /// `store` is about to be closed and nothing more will be written to it: sync its last
    /// changes to the replica (waiting for them at most the durable time-out) and stop
    /// replicating it, so that closing can checkpoint.
    func storeClosing(_ store: Store) async

    /// `user`'s store file was replaced with the store closed (import, restore, key rotation):
    /// forget the replication state kept beside it, so that the next registration starts from
    /// the new file (its next open ships it whole).
    func storeReplaced(_ user: UserID, path: String)

    /// `user`'s store, closed, is being deleted: remove the user from the replica, so that the
    /// next request creates an empty store instead of restoring the deleted one. Throws
    /// ``StoreError/replicationUnavailable(user:message:)`` when the replica cannot be cleared;
    /// the local store is then kept (the caller deletes its files only after this returned).
    func storeErased(_ user: UserID, path: String) async throws
}

/// A store brought back from the replica.
public struct ReplicaRestore: Sendable, Equatable {
    /// Where it came from (the user's replica URL).
    public var source: String
    /// Its schema version (`PRAGMA user_version`) as restored, before any migration.
    public var schemaVersion: Int64
    /// How long the restore took.
    public var durationMicroseconds: Int64

    public init(source: String, schemaVersion: Int64, durationMicroseconds: Int64) {
        self.source = source
        self.schemaVersion = schemaVersion
        self.durationMicroseconds = durationMicroseconds
    }
}
