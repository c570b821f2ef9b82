import Foundation
import Logging
import UserStoreCore

/// Proves, after a replication fault, that a store's replica holds what the store holds, instead
/// of trusting that Litestream picked up where it left off (docs/replication.md "The durable
/// rule").
///
/// With the store held (nothing else runs on it), a read transaction on a connection of its own
/// fixes the store's contents and a `/sync` with `wait` brings the replica to the same point (its
/// txid T). The store is released at once; then the replica is restored as of T into the staging
/// folder and both are compared with ``StoreDigest`` (rows and schema, SQLite's `dbhash` idea).
/// A difference is logged (`replica-diverged`) and repaired: Litestream lets go of the store, the
/// daemon empties its WAL (no Litestream holds a position in it any more), and registering it
/// again makes Litestream ship a full snapshot — which is compared once more.
package struct ReplicaCheck: Sendable {
    package let replicator: LitestreamReplicator
    package let registry: StoreRegistry

    /// What one comparison found.
    package enum Outcome: Equatable {
        /// The replica as of the sync equals the store.
        case matches
        /// They differ, in these tables (or the schema).
        case differs([String])
        /// Could not compare now (the store is busy being opened or closed, the replica or
        /// Litestream did not answer): tried again at the next health check.
        case notNow(String)
    }

    /// Compares `store` with its replica and repairs a replica that differs. Returns whether the
    /// store now counts as registered (its replica matches it).
    package func run(_ store: Store) async -> Bool {
        // Leased for the whole check: the store stays open, and is the one the check started on.
        guard let leased = registry.leaseIfReady(store.user) else { return false }
        defer { registry.release(store.user) }
        guard leased === store else { return false }
        switch await compare(store) {
        case .matches:
            return true
        case .notNow(let reason):
            replicator.failed("comparing \(store.user) with its replica", ReplicaCheckFailure(description: reason))
            return false
        case .differs(let differences):
            let outcome: Outcome
            do {
                try await resnapshot(store)
                outcome = await compare(store)
            } catch {
                outcome = .notNow("\(error)")
            }
            logDivergence(store.user, differences: differences, afterSnapshot: outcome)
            return outcome == .matches
        }
    }

    /// Compares `store` (leased by the caller) with its replica as of one sync.
    package func compare(_ store: Store) async -> Outcome {
        do {
            // First a sync that holds nothing: the replica catches up while requests go on, and a
            // replica still out of reach fails here without stopping the store's writes.
            let caughtUp = try await replicator.sync(store.path, until: replicator.durableDeadline)
            guard caughtUp.isReplicated else {
                return .notNow("the sync ended \(caughtUp.status) at txid \(caughtUp.txid) with the replica at \(caughtUp.replicatedTXID)")
            }
            let deadline = replicator.durableDeadline
            let reader = try StoreDigest.Reader(path: store.path)
            defer { reader.close() }
            // Then the one that fixes the point compared, with the store held: little to ship.
            let reply = try await store.whileHeld {
                try reader.pin()
                return try await replicator.sync(store.path, until: deadline)
            }
            guard reply.isReplicated else {
                return .notNow("the sync ended \(reply.status) at txid \(reply.txid) with the replica at \(reply.replicatedTXID)")
            }
            let live = try await BlockingPool.run { try reader.digest() }
            let copy: StoreDigest
            do {
                copy = try await BlockingPool.run { [self] in try digestOfReplica(store.user, txid: reply.txid) }
            } catch StoreError.replicaDamaged(_, let message) {
                // A copy Litestream cannot decode (an LTX chain broken by overlapping writers,
                // seen after a paused Litestream's stale requests ran) differs from any store:
                // it is shipped whole again like one that restores with other rows.
                return .differs(["the replica cannot be restored: \(message)"])
            } catch is ReplicaHoldsNothing {
                // What Litestream shipped went elsewhere (the replica had vanished meanwhile):
                // shipped whole again.
                return .differs(["the replica holds nothing of the store"])
            }
            let differences = live.differences(from: copy)
            return differences.isEmpty ? .matches : .differs(differences)
        } catch {
            return .notNow("\(error)")
        }
    }

    /// Makes Litestream ship `store` (leased by the caller) whole again: it lets go of it, the
    /// daemon empties the WAL, and a new registration finds its last position gone, so its next
    /// sync is a snapshot.
    private func resnapshot(_ store: Store) async throws {
        try await replicator.letGo(store)
        try await store.write { db in _ = try db.checkpoint(.truncate) }
        try await replicator.registerAgain(store)
    }

    /// The digest of `user`'s replica as of `txid`, restored into the staging folder and removed
    /// again (blocking).
    private func digestOfReplica(_ user: UserID, txid: Int64) throws -> StoreDigest {
        try FileManager.default.createDirectory(atPath: replicator.layout.stagingDirectory, withIntermediateDirectories: true)
        let scratch = replicator.layout.stagingDirectory + "/replica-check-\(UUID().uuidString).sqlite"
        guard let copy = try replicator.restorer.restoreCopy(user, from: replicator.registeredURL(for: user), arguments: ["-txid", String(format: "%016llx", txid)], beside: scratch) else {
            throw ReplicaHoldsNothing()
        }
        defer { for suffix in ["", "-wal", "-shm"] { unlink(copy + suffix) } }
        return try StoreDigest.read(path: copy)
    }

    /// Logs a replica that differed from its store (`replica-diverged`) and what its new
    /// snapshot showed.
    private func logDivergence(_ user: UserID, differences: [String], afterSnapshot: Outcome) {
        replicator.state.withLock { $0.diverged += 1 }
        let found = differences.joined(separator: "; ")
        let metadata: Logger.Metadata = ["event": "replica-diverged", "user": .string(user.rawValue), "differences": .string(found)]
        switch afterSnapshot {
        case .matches:
            replicator.logger.error("the replica of store '\(user)' differed from the store after a replication fault (\(found)); a new snapshot was shipped and matches", metadata: metadata)
        case .differs(let still):
            replicator.logger.critical("the replica of store '\(user)' differed from the store after a replication fault (\(found)); a new snapshot still differs (\(still.joined(separator: "; "))); durable writes stay refused", metadata: metadata)
        case .notNow(let reason):
            replicator.logger.error("the replica of store '\(user)' differed from the store after a replication fault (\(found)); shipping a new snapshot failed (\(reason)); tried again at the next check", metadata: metadata)
        }
    }
}

/// The replica holds no copy of the store at the point compared.
struct ReplicaHoldsNothing: Error {}

/// A comparison that could not be made.
package struct ReplicaCheckFailure: Error, CustomStringConvertible {
    package let description: String
}

extension LitestreamReplicator {
    /// The replica URL `user`'s open store is registered under (with more than one host, at the
    /// epoch it was registered with, which a bucket move may have passed since).
    package func registeredURL(for user: UserID) -> String {
        guard let epoch = registeredEpoch(of: user) else { return locations.replicaURL(for: user) }
        return locations.withSuffix(locations.userFolderSuffix(user) + "/e\(epoch)")
    }

    /// Has Litestream let go of `store` (confirmed): from then on nothing holds its WAL position.
    package func letGo(_ store: Store) async throws {
        state.withLock { state in
            if state.open[store.path]?.store === store { state.open[store.path]!.registered = false }
        }
        try await control.unregister(store.path, until: durableDeadline)
        state.withLock { state in
            if state.open[store.path]?.store === store { state.open[store.path]!.released() }
        }
        updateCheckpointing(of: store)
    }

    /// Registers `store` again (it counts as registered once compared).
    package func registerAgain(_ store: Store) async throws {
        guard holdForRegistration(store) else { throw ReplicaCheckFailure(description: "the store was closed") }
        try await control.register(store.path, replicaURL: try prepareRegistration(store))
    }
}
