import Synchronization

/// One `/sync` at a time per store, shared by every caller that waits for it (group commit).
///
/// **One at a time.** Litestream 0.5.17 races with itself when two syncs of one database overlap
/// (the sync pass and a durable write, or two durable writes): one fails with `rename ltx file: …
/// no such file or directory` (both wrote the same temporary LTX file), or comes back with the
/// replica a transaction behind. So the syncs of a store form a queue: each starts when the one
/// before it has ended.
///
/// **Shared.** A sync that is queued and has not started yet covers every commit made before it
/// starts, so a caller arriving while one waits joins it instead of queueing its own: however
/// many durable writes a store takes at once, at most two of its syncs exist (one running, one
/// waiting), and each round trip to the replica acknowledges every write that arrived during the
/// one before. A sync that has started is never joined: its LTX file may have been cut before
/// the caller's commit.
///
/// **Bounded.** Every sync is bounded by the deadline of the caller that queued it
/// (`replication.durableTimeoutMilliseconds` from when it asked), and those queued earlier by
/// theirs, so a caller's wait ends by the deadline of the sync it joined — never later than its
/// own, at most one durable time-out after the first caller of that sync asked.
package final class SyncLanes<Reply: Sendable>: Sendable {
    private struct Lane {
        /// The last sync queued on the lane: running, or waiting for the one before it.
        var tail: Task<Reply, any Error>
        /// Whether `tail` has started (then a new caller queues a sync of its own behind it).
        var started: Bool
        /// Tells the tail apart from a later one, so that only the last removes the lane.
        var generation: UInt64
    }

    private let lanes = Mutex<[String: Lane]>([:])
    private let generations = Atomic<UInt64>(0)
    private let counters = Mutex(Counters())

    /// How many syncs ran, and how many callers were answered by a sync another caller queued.
    package struct Counters: Sendable, Equatable {
        var started = 0
        var joined = 0
    }

    /// What the lanes did since they were made.
    package var counts: Counters { counters.withLock { $0 } }

    /// A sync that waited behind others of its store until its deadline, and never ran.
    package struct Expired: Error, CustomStringConvertible {
        package let description = "queued behind another sync of the store until its deadline"
    }

    /// Returns the result of a sync of `path` that starts after this call: the one already
    /// queued behind a running sync (shared with its callers), or `sync`, queued behind every
    /// sync of that path before it. The wait ends by the deadline of the sync joined (`deadline`
    /// when it is this caller's own); a sync whose deadline passed while it was queued throws
    /// ``Expired`` without running.
    package func run(_ path: String, until deadline: ContinuousClock.Instant,
             _ sync: @escaping @Sendable () async throws -> Reply) async throws -> Reply {
        try await enqueue(path, until: deadline, sync).value
    }

    /// ``run(_:until:_:)`` without the wait: the sync this caller gets (joined or its own),
    /// settled before this returns.
    package func enqueue(_ path: String, until deadline: ContinuousClock.Instant,
                 _ sync: @escaping @Sendable () async throws -> Reply) -> Task<Reply, any Error> {
        lanes.withLock { lanes in
            if let lane = lanes[path], !lane.started {
                counters.withLock { $0.joined += 1 }
                return lane.tail
            }
            let previous = lanes[path]?.tail
            let generation = generations.add(1, ordering: .relaxed).newValue
            let work = Task<Reply, any Error> {
                _ = await previous?.result
                // From here on a new caller queues its own sync: its commit may come after this
                // sync read the WAL.
                self.lanes.withLock { lanes in
                    if lanes[path]?.generation == generation { lanes[path]!.started = true }
                }
                defer {
                    // The last sync of a lane removes it: the dictionary holds stores being synced only.
                    self.lanes.withLock { lanes in
                        if lanes[path]?.generation == generation { lanes[path] = nil }
                    }
                }
                guard ContinuousClock.now < deadline else { throw Expired() }
                self.counters.withLock { $0.started += 1 }
                return try await sync()
            }
            lanes[path] = Lane(tail: work, started: false, generation: generation)
            return work
        }
    }
}
