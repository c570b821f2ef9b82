import Foundation
import UserStoreCore

/// What a ``LitestreamReplicator`` knows now: its open stores and how Litestream is doing.
struct ReplicationState {
    /// Open stores by path.
    var open: [String: ReplicatedStore] = [:]
    /// The last failure talking to Litestream, while it lasts.
    var lastError: String?
    var degradedSince: Date?
    /// Per registered path: when Litestream last synced it (`/list`).
    var lastSync: [String: Date] = [:]
    /// The Litestream that last answered `/info`.
    var litestream: LitestreamControl.Instance?
    /// Since when no Litestream answers (nil while one does).
    var unansweredSince: ContinuousClock.Instant?
    /// Stores brought back from the replica since start.
    var restored = 0
    /// Closed stores whose unregistration the running Litestream did not confirm: it may
    /// still hold their WAL position (so their WAL was kept at close), and their files are
    /// not replaced until it lets go.
    var unconfirmed: Set<String> = []
    /// With more than one host: the epoch each open store was last registered under.
    var epochs: [String: Int64] = [:]
    /// Replicas found to differ from their store, and resnapshotted, since start.
    var diverged = 0
    /// How long the last sync pass took.
    var lastPass: Duration = .zero
    /// The longest sync pass since start: what the plain-write loss window's bound depends on.
    var longestPass: Duration = .zero
    /// What the last check of the replica itself found wrong (its named error), while it lasts.
    var replicaProblem: String?
}

/// One open store, as replication sees it.
struct ReplicatedStore {
    let store: Store
    /// Litestream replicates it, and it counts as replicated: durable writes may wait for it.
    var registered = false
    /// Since when its registration may have reached the running Litestream, which may then
    /// hold a position in its WAL: until that Litestream confirms the unregistration, leaves
    /// it out of a `/list` asked for later, or ends, the daemon never resets the WAL.
    var heldSince: ContinuousClock.Instant?
    /// Since when that Litestream is known to hold it: its registration was answered, or a
    /// `/list` showed it. A `/list` asked for later that lacks the store means Litestream
    /// forgot it (it restarted). Not ``heldSince``: a `/list` served while the registration
    /// is still on its way lacks the store too, and that Litestream is about to hold it.
    var confirmedSince: ContinuousClock.Instant?

    /// No running Litestream holds a position in its WAL any more.
    mutating func released() {
        heldSince = nil
        confirmedSince = nil
    }
}
