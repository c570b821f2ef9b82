import Foundation
import UserStoreCore

/// A store brought back from the log, and the look for a newer copy before a store opens: what
/// the registry asks of the replica before it opens a store (``StoreReplication``).
extension LogReplicator {
    // The registry's calls run on the blocking pool's threads (``BlockingPool/executing(_:)``):
    // between their requests to the replica they read and write files and decode the log.

    package func restore(_ user: UserID, to path: String, timestamp: Date?) async throws -> ReplicaRestore? {
        try await BlockingPool.executing { try await restoreOnPool(user, to: path, timestamp: timestamp) }
    }

    private func restoreOnPool(_ user: UserID, to path: String, timestamp: Date?) async throws -> ReplicaRestore? {
        try identity.require(for: user)
        do {
            try await fencer.fenceHeldEpoch()
            try await fencer.fenceBucket(of: user)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "fencing the log for this host's epoch: \(error)")
        }
        let started = ContinuousClock.now
        let staged = path + ".restoring"
        // Also what a restore a crash cut short left (on the pool's thread: three system calls).
        defer { for suffix in ["", "-wal", "-shm"] { unlink(staged + suffix) } }
        // A new user: the index answers without a request.
        if timestamp == nil, logHoldsNothing(of: user), index.legacyHolds(user.rawValue) == false { return nil }
        return try await restore(user, staged: staged, to: path, timestamp: timestamp, started: started)
    }

    /// ``restore(_:to:timestamp:)`` through `staged`, which the caller removes.
    private func restore(_ user: UserID, staged: String, to path: String, timestamp: Date?, started: ContinuousClock.Instant) async throws -> ReplicaRestore? {
        let restored: LogRestorer.Restored?
        do {
            restored = try await restorer.restore(user.rawValue, to: staged, timestamp: timestamp)
        } catch let error as StoreError {
            throw error // an encrypted copy without its key: StoreKeyMissing, StoreErased
        } catch let damaged as LogSegment.Damaged {
            throw StoreError.replicaDamaged(user: user, message: damaged.description)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "reading the log: \(error)")
        }
        guard let restored else {
            // Nothing in the log: a copy in Litestream's layout, from before `engine: log`, is
            // restored once (its next open ships it to the log as a base).
            if index.legacyHolds(user.rawValue) != false, let copy = try await legacy.restore(user, to: path, timestamp: timestamp) {
                baseDue(user, path: path)
                state.withLock { $0.restored += 1 }
                // (The registry logs store-restored with the source; this says why it is not the log.)
                logger.info("\(user) had nothing in the log: restored from its copy in Litestream's layout, it replicates to the log from now on")
                return copy
            }
            if timestamp == nil { try await identity.confirm(before: user) }
            return nil
        }
        // An encrypted copy is read with the user's key (the restore checked it has one).
        let cipher = try await StoreKeyring.cipher(ifEncrypted: staged, user: user, keyring: restorer.keyring)
        let schemaVersion = try publish(staged, of: user, restored: restored, cipher: cipher, as: path, timestamp: timestamp)
        state.withLock { $0.restored += 1 }
        return ReplicaRestore(source: storage.describe(LogRestorer.folder), schemaVersion: schemaVersion,
                              durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds)
    }

    /// Puts the copy `staged`, restored from the log, in place as `path` and returns its schema
    /// version (`cipher`: the copy's, nil when it is plaintext). Blocking.
    private func publish(_ staged: String, of user: UserID, restored: LogRestorer.Restored, cipher: PageCipher?, as path: String, timestamp: Date?) throws -> Int64 {
        do throws(ChangeLogError) {
            try ChangeLog.continuePositionsAfterReplicaRestore(staged, cipher: cipher)
        } catch {
            throw StoreError.storageFailure(user: user, message: "moving the restored copy's change log past the replica's positions: \(error.message)")
        }
        let schemaVersion = StoreFileInspector.schemaVersion(of: staged, cipher: cipher)
        do {
            try DurableFile.publishDatabase(staged, as: path)
        } catch {
            throw StoreError.storageFailure(user: user, message: "putting the restored copy in place: \(error)")
        }
        // The position the file now holds: a reopen under the same epoch continues the stream. Not
        // after a point in time: the log already holds later commits of that stream, so the
        // store starts a new one (a base at its first open) rather than reuse their txids.
        if timestamp == nil {
            try? LogPosition(stream: restored.stream, epoch: restored.epoch, txid: restored.txid, salt: nil, frames: 0).save(beside: path)
        } else {
            baseDue(user, path: path)
        }
        return schemaVersion
    }

    package func newerCopy(of user: UserID, path: String) async throws -> Int64? {
        try await BlockingPool.executing { try await newerCopyOnPool(of: user, path: path) }
    }

    private func newerCopyOnPool(of user: UserID, path: String) async throws -> Int64? {
        // A store last replicated under an older epoch than the one held (in a cluster: than its
        // bucket's now): another host may have written the user since. A pending position (a
        // base was on its way) names the epoch the file was written under too.
        let held = cluster.map { $0.epoch(of: user) } ?? lease?.heldEpoch
        guard let held else { return nil }
        let position = LogPosition.load(path)
        if let position, position.epoch >= held { return nil }
        // No position at all: a store the log never held (from before the log), or one whose
        // creation a crash cut short (it is registered once migrated). Its epoch is unknown:
        // whatever the log holds of the user is the copy to trust — none as a rule.
        if position == nil, logHoldsNothing(of: user) { return nil }
        do {
            try await fencer.fenceBucket(of: user)
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "fencing the log for the bucket's epoch: \(error)")
        }
        do {
            let epochs = try await restorer.records(of: user.rawValue).map(\.record.epoch)
            return epochs.filter { $0 > position?.epoch ?? .min }.max()
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "looking for a newer copy in the log: \(error)")
        }
    }

    /// Whether the index of the log (listed while the replica was verified and this host held
    /// it) says, without a request, that the log holds nothing of `user`: neither records nor
    /// folds. Not with more than one host, where another host may have written or folded the
    /// user since the listing.
    private func logHoldsNothing(of user: UserID) -> Bool {
        cluster == nil && index.keys(of: user.rawValue)?.isEmpty == true && index.folds(of: user.rawValue)?.isEmpty == true
    }
}
