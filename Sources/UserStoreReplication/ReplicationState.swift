import Foundation
import UserStoreCore

/// What a ``LitestreamReplicator`` knows now: its open stores and how Litestream is doing.
package struct ReplicationState {
    /// Open stores by path.
    var open: [String: ReplicatedStore] = [:]
    /// The last failure talking to Litestream, while it lasts.
    package var lastError: String?
    package var degradedSince: Date?
    /// Per registered path: when Litestream last synced it (`/list`).
    package var lastSync: [String: Date] = [:]
    /// The Litestream that last answered `/info`.
    package var litestream: LitestreamControl.Instance?
    /// Since when no Litestream answers (nil while one does).
    package var unansweredSince: ContinuousClock.Instant?
    /// Stores brought back from the replica since start.
    package var restored = 0
    /// Closed stores whose unregistration the running Litestream did not confirm: it may
    /// still hold their WAL position (so their WAL was kept at close), and their files are
    /// not replaced until it lets go.
    package var unconfirmed: Set<String> = []
    /// With more than one host: the epoch each open store was last registered under.
    package var epochs: [String: Int64] = [:]
    /// Replicas found to differ from their store, and resnapshotted, since start.
    package var diverged = 0
    /// How long the last sync pass took.
    package var lastPass: Duration = .zero
    /// The longest sync pass since start: what the plain-write loss window's bound depends on.
    package var longestPass: Duration = .zero
    /// What the last check of the replica itself found wrong (its named error), while it lasts.
    package var replicaProblem: String?
}

/// One open store, as replication sees it.
package struct ReplicatedStore {
    package let store: Store
    /// Litestream replicates it, and it counts as replicated: durable writes may wait for it.
    package var registered = false
    /// Since when its registration may have reached the running Litestream, which may then
    /// hold a position in its WAL: until that Litestream confirms the unregistration, leaves
    /// it out of a `/list` asked for later, or ends, the daemon never resets the WAL.
    package var heldSince: ContinuousClock.Instant?
    /// Since when that Litestream is known to hold it: its registration was answered, or a
    /// `/list` showed it. A `/list` asked for later that lacks the store means Litestream
    /// forgot it (it restarted). Not ``heldSince``: a `/list` served while the registration
    /// is still on its way lacks the store too, and that Litestream is about to hold it.
    package var confirmedSince: ContinuousClock.Instant?

    /// No running Litestream holds a position in its WAL any more.
    package mutating func released() {
        heldSince = nil
        confirmedSince = nil
    }
}
