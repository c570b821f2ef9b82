import Foundation
import UserStoreCore

/// What the daemon asks the keeper while it serves: whether a store may be served and a durable
/// write acknowledged now (the rules are in ``LeaseKeeper``'s own documentation).
extension LeaseKeeper {
    /// The epoch this host holds, nil while it holds none.
    package var heldEpoch: Int64? { state.withLock { $0.held?.lease.epoch } }

    /// The epoch replica paths carry: the one held, or after losing it the one held last (what
    /// is still uploaded then goes where the new holder's restores do not read once it wrote).
    package var pathEpoch: Int64? { state.withLock { $0.held?.lease.epoch ?? $0.lastEpoch } }

    /// Whether a durable write replicated under `epoch` may be acknowledged now: the lease is
    /// held at that epoch, its last renewal began less than ``acknowledgeWithin`` ago, and the
    /// last look that found it unchanged began less than ``confirmationWindow`` ago.
    package func mayAcknowledge(epoch: Int64?) -> Bool {
        state.withLock { state in
            guard let until = Self.acknowledgesUntil(state), ContinuousClock.now < until else { return false }
            return epoch == state.held?.lease.epoch
        }
    }

    /// Until when durable writes may be acknowledged as things stand: the earlier of the lease's
    /// end (``acknowledgeWithin`` after its last renewal began) and ``confirmationWindow`` after
    /// the last look that found it this host's began. Nil while no lease is held.
    package var acknowledgesUntil: ContinuousClock.Instant? { state.withLock { Self.acknowledgesUntil($0) } }

    private static func acknowledgesUntil(_ state: State) -> ContinuousClock.Instant? {
        guard state.held != nil, let until = state.validUntil, let confirmed = state.confirmedAt else { return nil }
        return min(until, confirmed + confirmationWindow)
    }

    /// Whether this host holds the lease and its last renewal is within the lease (what
    /// `userstore_replication_lease_held` shows).
    package var isValid: Bool {
        state.withLock { state in state.held != nil && state.validUntil.map { ContinuousClock.now < $0 } ?? false }
    }

    /// The acknowledge rule for a durable write stored under `epoch` (``mayAcknowledge(epoch:)``):
    /// free while the keeper's rounds keep the lease confirmed (a read every second); when the
    /// last confirmation is older than ``confirmationWindow`` (the keeper starved, the replica
    /// slow) but the lease is still held, one read of it, shared by every durable write waiting
    /// meanwhile (one begun less than a second ago is shared). No look per write is needed: a
    /// host that takes the lease over writes its fence only after ``fenceNotBefore``, when this
    /// host can no longer acknowledge anything it did not store before the fence listed the log.
    package func confirmHeld(epoch: Int64?) async -> Bool {
        if mayAcknowledge(epoch: epoch) { return true }
        let task = state.withLock { state -> Task<Bool, Never>? in
            guard state.held?.lease.epoch == epoch, state.validUntil.map({ ContinuousClock.now < $0 }) ?? false else { return nil }
            if let current = state.confirmation, ContinuousClock.now - current.started < .seconds(1) { return current.task }
            let started = ContinuousClock.now
            let task = Task { await self.look(started: started) }
            state.confirmation = (started, task)
            return task
        }
        guard let task else { return false }
        return await task.value && mayAcknowledge(epoch: epoch)
    }

    /// When the fence of the lease held may be written: at once for a lease taken from nobody,
    /// from a released or gone holder, or after it ran out (its holder stopped acknowledging
    /// before this host could take it); ``confirmationWindow`` plus a margin for the clocks' rates
    /// after an operator's take-over of a live holder, which acknowledges what it stores until its
    /// last confirmation is that old.
    package var fenceNotBefore: ContinuousClock.Instant { state.withLock { $0.fenceNotBefore } }

    /// Reads the lease: true when it is still the one this host holds (a look, begun at
    /// `started`); a lease another host wrote means it was lost.
    private func look(started: ContinuousClock.Instant) async -> Bool {
        guard let held = state.withLock({ $0.held }) else { return false }
        let object: ReplicaStorage.StoredObject?
        do {
            object = try await storage.readObject(ReplicaLease.name)
        } catch {
            failed("\(error)")
            return false
        }
        let lease = object.flatMap { ReplicaLease(json: $0.data) }
        // A renewal of ours that landed after the keeper last wrote it down is still ours (durable
        // writes confirmed during a renewal were refused: seen with many on S3).
        let renewedByUs = lease.map { $0.incarnation == incarnation && $0.epoch == held.lease.epoch && $0.released != true } ?? false
        guard let object, renewedByUs || isOurs(lease, version: object.version, held: held) else {
            // Not ours any more — unless a renewal of ours landed meanwhile (the next round adopts
            // it). Lost only if the lease held is still the one this read was compared with.
            if lease?.incarnation != incarnation { _ = lost(to: lease, version: object?.version, held: held.version) }
            return false
        }
        state.withLock { state in
            if state.held?.lease.epoch == held.lease.epoch, state.confirmedAt.map({ $0 < started }) ?? true { state.confirmedAt = started }
        }
        return true
    }

    /// Serves `user` while this host holds the lease — also while the replica cannot be
    /// reached to renew it (an outage: stores are served as when the bucket is down, durable
    /// writes fail), as long as the keeper's last round found that outage and it is still
    /// trying (a round under way, or one ended less than 2 s ago). A host that was paused past
    /// its lease made no round meanwhile: it serves nothing until a round has found the lease
    /// still its own.
    package func admit(_ user: UserID) throws(StoreError) {
        let refusal = state.withLock { state -> String? in
            guard state.held != nil else { return Self.refusal(state, host: host) }
            let now = ContinuousClock.now
            if let until = state.validUntil, now < until { return nil }
            if state.lastRoundFailed, state.inRound || state.lastRound.map({ now - $0 < .seconds(2) }) ?? false { return nil }
            return Self.refusal(state, host: host)
        }
        if let refusal { throw .replicationUnavailable(user: user, message: refusal) }
    }

    /// Why this host serves no store now, in an operator's words.
    private static func refusal(_ state: State, host: String) -> String {
        if state.held != nil {
            return "host \(host) has not renewed the replica's writer lease in time (\(state.problem ?? "the replica did not answer")); it serves again once it has"
        }
        if let lease = state.seen?.lease {
            return "the replica's writer lease is held by \(lease.summary); host \(host) takes it over once it has seen it unrenewed for \(lease.leaseSeconds) s, or at once with userstorectl replication take-over"
        }
        return "host \(host) does not hold the replica's writer lease yet (\(state.problem ?? "taking it"))"
    }

    /// What `Status` shows of the lease.
    package struct Snapshot: Sendable {
        /// `holding`, `standby` (another host holds it) or `unknown` (the replica did not answer).
        package var state: String
        package var holder: String?
        package var epoch: Int64?
        package var renewedAt: String?
        package var expiresAt: String?
        package var problem: String?
        package var acquisitions: Int
        package var losses: Int
    }

    package var snapshot: Snapshot {
        state.withLock { state in
            let lease = state.held?.lease ?? state.seen?.lease
            let phase = state.held != nil ? "holding" : state.seen != nil ? "standby" : "unknown"
            return Snapshot(state: phase, holder: lease?.holder, epoch: lease?.epoch, renewedAt: lease?.renewedAt,
                            expiresAt: lease?.expiresAt, problem: state.problem, acquisitions: state.acquisitions, losses: state.losses)
        }
    }
}
