import Synchronization

/// Which users a bucket holds anything of, listed once when the daemon starts and kept current
/// by the daemon itself, so that a new user costs no request to the bucket (issue #38).
///
/// Only with one host and an `s3://` replica: this daemon is then the only writer under its
/// replica path, so after the listing a user can only appear there through its own
/// registrations (added before Litestream ships anything) and leave through its own erases.
/// With more than one host a user's bucket moves between hosts, and a new owner must look;
/// on `file://` a look into the folder costs microseconds anyway.
package final class ReplicaIndex: Sendable {
    private struct State {
        var loaded = false
        var users: Set<String> = []
        /// Erased since the listing began (a listing still running may have seen them).
        var erased: Set<String> = []
        /// Which listing counts: one begun before a ``reset()`` does not.
        var generation = 0
    }

    private let state = Mutex(State())

    /// Whether the bucket holds anything of `user`: nil until the listing is in (ask the bucket).
    package func holds(_ user: String) -> Bool? {
        state.withLock { $0.loaded ? $0.users.contains(user) : nil }
    }

    /// How many users the bucket holds, once listed.
    package var count: Int? { state.withLock { $0.loaded ? $0.users.count : nil } }

    /// `user`'s store is about to be registered (Litestream will ship it), or was found there.
    package func insert(_ user: String) {
        state.withLock { state in
            state.users.insert(user)
            state.erased.remove(user)
        }
    }

    /// Everything of `user` was erased from the bucket.
    package func remove(_ user: String) {
        state.withLock { state in
            state.users.remove(user)
            if !state.loaded { state.erased.insert(user) }
        }
    }

    /// Forgets the listing — the replica was initialised anew, or this host took the writer lease
    /// over from another that may have written meanwhile: until it is listed again, every new
    /// user asks the replica, and a listing begun before now does not count.
    package func reset() {
        state.withLock { state in
            state = State(generation: state.generation + 1)
        }
    }

    /// A listing begins: pass what this returns to ``loaded(_:generation:)``.
    package func beginListing() -> Int { state.withLock { $0.generation } }

    /// The listing begun at `generation` is in: `listed` holds every user it found. Users
    /// registered while it ran are kept; users erased while it ran are not taken from it. A
    /// listing begun before a ``reset()`` is dropped (returns false).
    @discardableResult
    package func loaded(_ listed: Set<String>, generation: Int) -> Bool {
        state.withLock { state in
            guard state.generation == generation else { return false }
            state.users.formUnion(listed.subtracting(state.erased))
            state.erased = []
            state.loaded = true
            return true
        }
    }
}
