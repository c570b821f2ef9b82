import Synchronization

/// One `/sync` at a time per store. Litestream 0.5.17 races with itself when two syncs of one
/// database overlap (the sync pass and a durable write, or two durable writes): one fails with
/// `rename ltx file: … no such file or directory` (both wrote the same temporary LTX file), or
/// comes back with the replica a transaction behind. So the syncs of a store form a queue: each
/// starts when the one before it has ended; every sync is bounded by its own deadline, so a
/// queue never outlasts the deadline of its newest caller.
final class SyncLanes: Sendable {
    private struct Lane {
        /// Ends when the last sync queued on the lane has ended.
        var tail: Task<Void, Never>
        /// Tells the tail apart from a later one, so that only the last removes the lane.
        var generation: UInt64
    }

    private let lanes = Mutex<[String: Lane]>([:])
    private let generations = Atomic<UInt64>(0)

    /// A sync that waited behind others of its store until its deadline, and never ran.
    struct Expired: Error, CustomStringConvertible {
        let description = "queued behind another sync of the store until its deadline"
    }

    /// Runs `sync` for `path` once every sync queued before it on that path has ended, and
    /// returns its result. Every sync is bounded by its own deadline and those queued earlier
    /// by theirs (each is `replication.durableTimeoutMilliseconds` from when it was asked for),
    /// so the wait ends by `deadline`: a sync whose deadline passed while it was queued throws
    /// ``Expired`` without running.
    func run<Reply: Sendable>(_ path: String, until deadline: ContinuousClock.Instant,
                              _ sync: @escaping @Sendable () async throws -> Reply) async throws -> Reply {
        let generation = generations.add(1, ordering: .relaxed).newValue
        let work: Task<Reply, any Error> = lanes.withLock { lanes in
            let previous = lanes[path]?.tail
            let work = Task<Reply, any Error> {
                await previous?.value
                guard ContinuousClock.now < deadline else { throw Expired() }
                return try await sync()
            }
            lanes[path] = Lane(tail: Task { _ = try? await work.value }, generation: generation)
            return work
        }
        defer {
            // The last sync of a lane removes it: the dictionary holds stores being synced only.
            lanes.withLock { lanes in
                if lanes[path]?.generation == generation { lanes[path] = nil }
            }
        }
        return try await work.value
    }
}
