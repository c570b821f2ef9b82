import Foundation
import UserStoreCore

/// Syncs: a durable write's, and the pass that bounds how old a lost plain write can be.
extension LitestreamReplicator {
    /// Waits until every transaction committed to `user`'s store so far is in the replica, until
    /// `deadline` at the latest. Throws ``StoreError/replicationUnavailable(user:message:)`` when
    /// that cannot be confirmed by then — also when the store does not count as registered (not
    /// open, Litestream not answering, or registered again after a fault and not yet compared
    /// with its replica).
    package func waitUntilReplicated(_ user: UserID, until deadline: ContinuousClock.Instant) async throws {
        // A replica that vanished or is another one holds nothing that counts.
        try identity?.require(for: user)
        let path = layout.storePath(for: user)
        // An open store whose first registration is still to come (opened while Litestream did
        // not answer a health check, just after it started) is waited for, within the same
        // deadline; one that stopped counting as registered after a fault fails at once.
        var store: Store?
        while true {
            let entry = state.withLock { $0.open[path] }
            if let entry, entry.registered { store = entry.store; break }
            guard let entry, entry.confirmedSince == nil, ContinuousClock.now + .milliseconds(20) < deadline else {
                throw StoreError.replicationUnavailable(user: user, message: "the store is not registered with Litestream (\(state.withLock { $0.lastError } ?? (entry == nil ? "not open" : "not yet registered")))")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        guard let store else { return }
        // This sync covers every commit so far: the next sync pass need not repeat it (a commit
        // after this point sets the flag again).
        let written = store.wal.take()
        do {
            while true {
                let reply = try await sync(path, until: deadline)
                if reply.isReplicated { break }
                // A sync can come back with the replica one transaction behind (measured under
                // the cluster harness before syncs were queued per store: "synced at txid 5,
                // replica at 4"): ask again, within the same time limit.
                guard ContinuousClock.now + .milliseconds(10) < deadline else {
                    throw LitestreamControl.Failure(description: "sync ended \(reply.status) at txid \(reply.txid), replica at \(reply.replicatedTXID), and did not catch up within \(settings.durableTimeoutMilliseconds) ms")
                }
                try await Task.sleep(for: .milliseconds(10)) // let the other sync finish before asking again
            }
        } catch {
            if written { store.wal.restore() }
            syncFailed(store, error)
            throw StoreError.replicationUnavailable(user: user, message: "\(error)")
        }
        // One host: acknowledged only inside the writer lease, at the epoch the store replicates
        // under, confirmed by a read of the lease after the replica had the commit (a host paused
        // past its lease, or fenced by a take-over, acknowledges nothing).
        // More than one host: the marker read again after the sync (what Litestream confirmed may
        // have gone into an empty mount point since the last check); the cluster's own rule follows.
        if lease == nil, let identity {
            try await BlockingPool.run { try identity.confirmPresent(for: user) }
        }
        if let lease, await !lease.confirmHeld(epoch: registeredEpoch(of: user), after: .now) {
            throw StoreError.replicationUnavailable(user: user, message: "committed here and in the replica under epoch \(registeredEpoch(of: user).map(String.init) ?? "none"), but this host does not hold the replica's writer lease now (\(lease.snapshot.holder.map { "held by \($0), epoch \(lease.snapshot.epoch ?? 0)" } ?? "not renewed in time")): the write may be lost")
        }
    }

    /// `POST /sync` with `wait` for the store at `path`, queued behind any other sync of it and
    /// shared with the callers that arrive while it waits (``SyncLanes``); by `deadline`.
    package func sync(_ path: String, until deadline: ContinuousClock.Instant) async throws -> LitestreamControl.SyncReply {
        let control = self.control, recorded = syncDuration
        return try await syncLanes.run(path, until: deadline) {
            let started = ContinuousClock.now
            defer { recorded?(ContinuousClock.now - started) }
            return try await control.syncAndWait(path, until: deadline)
        }
    }

    /// A sync of `store` failed (Litestream, or the replica behind it, did not confirm it): the
    /// store no longer counts as replicated — durable writes to it fail at once instead of each
    /// waiting out its time-out — until the health check has compared it with its replica.
    package func syncFailed(_ store: Store, _ error: any Error) {
        state.withLock { state in
            if state.open[store.path]?.store === store { state.open[store.path]!.registered = false }
        }
        failed("sync \(store.user)", error)
    }

    /// Syncs every registered store written since the last pass to the replica, waiting for
    /// each, at most 64 at a time (with many written stores the pass itself must end well within
    /// the interval). Run every quarter of ``ReplicationSettings/syncIntervalMilliseconds`` by
    /// ``ReplicationMonitor``, so that a write acknowledged one interval ago is in the replica
    /// (Litestream's own loops alone took up to 1.3 s with its fixed 1 s interval: a local pass,
    /// then an upload pass, each on its own ticker). Returns how long the pass took.
    @discardableResult
    package func syncWrittenStores() async -> Duration {
        let started = ContinuousClock.now
        let written = state.withLock { state in
            state.open.values.filter { $0.registered && $0.store.wal.take() }.map(\.store)
        }
        let deadline = durableDeadline
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            for store in written {
                if running == 64 {
                    await group.next()
                    running -= 1
                }
                running += 1
                group.addTask {
                    do {
                        _ = try await self.sync(store.path, until: deadline)
                    } catch {
                        // Closed meanwhile: its final sync covered it (not an outage).
                        guard self.isRegistered(store) else { return }
                        store.wal.restore()
                        self.syncFailed(store, error)
                    }
                }
            }
        }
        let took = ContinuousClock.now - started
        state.withLock { state in
            state.lastPass = took
            state.longestPass = max(state.longestPass, took)
        }
        return took
    }

    private func isRegistered(_ store: Store) -> Bool {
        state.withLock { $0.open[store.path].map { $0.store === store && $0.registered } ?? false }
    }
}
