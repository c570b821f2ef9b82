import Foundation
import Logging
import Synchronization
import UserStoreCore
import UserStoreS3

/// Takes, renews and gives up the replica's writer lease (``ReplicaLease``) with one host, and
/// is the registry's placement: a host that does not hold the lease serves no store
/// (`ReplicationUnavailable`, naming the holder), uploads nothing and acknowledges nothing
/// (docs/replication.md, "One writer").
///
/// - **Taking it**: a replica without a lease gets one (`If-None-Match: *`); this data
///   directory's own lease (a restart) is taken back at once at the same epoch; a lease its
///   holder released (a clean stop), or whose holder ran on this machine and whose process is
///   gone (``ProcessIdentity``), is taken at once; any other is taken only after this host has
///   seen it unchanged — the same version, so not renewed — for `leaseSeconds` by its own clock,
///   and then under a new epoch, by compare-and-swap on that version. No clocks are compared
///   across hosts: the holder stops acknowledging `leaseSeconds` less a margin after its last
///   renewal *began*, which is before the version the taker saw was written.
/// - **Holding it**: read every second and renewed every third of `leaseSeconds` (`If-Match` on
///   the version this host wrote; a failed renewal is tried again a second later). A read or a
///   renewal that finds another version means another host took over: the lease is lost, every
///   store is closed (``onLost``), and this host waits like any other. Durable writes are
///   acknowledged only within the lease and while the last read that found it unchanged is
///   recent (``confirmationWindow``): a holder paused past that acknowledges nothing after it
///   resumes until it has looked again.
/// - An operator's take-over (``takeOver()``) takes it at once under a new epoch; the old
///   holder, if it comes back, finds the new version and is fenced. The new holder writes its
///   fence only once the old holder can no longer acknowledge (``fenceNotBefore``): the old holder
///   acknowledges only within ``confirmationWindow`` of a look that found the lease its own, and
///   every such look began before the take-over landed — so whatever it acknowledged was stored
///   before the fence listed the log, and no durable write needs a look of its own.
package final class LeaseKeeper: StorePlacement, Sendable {
    /// The keeper's state (LeaseKeeper+Acknowledging.swift reads it too).
    struct State {
        /// The lease this host holds, as written, and its version; nil while it holds none.
        var held: (lease: ReplicaLease, version: String)?
        /// Durable writes may be acknowledged, and stores served, before this instant.
        var validUntil: ContinuousClock.Instant?
        /// The epoch held last (kept after the lease is lost: what is still uploaded goes there).
        var lastEpoch: Int64?
        /// Another holder's lease as last read, its version, and since when this host has seen
        /// that version unchanged.
        var seen: (lease: ReplicaLease?, version: String?, since: ContinuousClock.Instant)?
        /// A write of the lease whose answer did not arrive (it may have landed): its renewal
        /// count and when it was sent.
        var pending: (lease: ReplicaLease, started: ContinuousClock.Instant)?
        /// Why the replica could not be asked, while it could not.
        var problem: String?
        /// When the last round ended, and whether it could not reach the lease (an outage, not
        /// another holder).
        var lastRound: ContinuousClock.Instant?
        var lastRoundFailed = false
        /// Whether a round is under way (a request to a replica that hangs takes its time-out).
        var inRound = false
        /// When the last renewal (or acquisition) that succeeded began.
        var renewedAt: ContinuousClock.Instant?
        /// When the last read that found the held lease unchanged (or the last renewal) began:
        /// durable writes are acknowledged only while it is recent (``confirmationWindow``).
        var confirmedAt: ContinuousClock.Instant?
        /// The read of the lease durable writes wait for now (shared), and when it began.
        var confirmation: (started: ContinuousClock.Instant, task: Task<Bool, Never>)?
        /// The fence of the lease held may be written from this instant on (``fenceNotBefore``).
        var fenceNotBefore = ContinuousClock.now
        /// How many times a lease was taken and lost since start.
        var acquisitions = 0
        var losses = 0
    }

    package let storage: ReplicaStorage
    package let identity: ReplicaIdentity
    /// This host's name (the lease names it).
    package let host: String
    package let leaseSeconds: Int
    /// This process (the lease names it).
    package let incarnation = UUID().uuidString.lowercased()
    private let logger: Logger
    let state = Mutex(State())
    /// One round at a time (the keeper's loop, the health check after the replica came back,
    /// an operator's init or take-over): two would race their own compare-and-swaps.
    private let rounds = AsyncLock()
    /// Told when this host lost the lease it held (closes every store).
    private let lostHandler = Mutex<(@Sendable () -> Void)?>(nil)
    /// Told when this host took the lease (at the epoch given).
    private let acquiredHandler = Mutex<(@Sendable (Int64) -> Void)?>(nil)

    package init(storage: ReplicaStorage, identity: ReplicaIdentity, host: String, leaseSeconds: Int, logger: Logger) {
        self.storage = storage
        self.identity = identity
        self.host = host
        self.leaseSeconds = leaseSeconds
        self.logger = logger
    }

    /// How long a durable reply may still be sent after a renewal began: the lease's time less
    /// a margin for the time a reply takes to leave, and the clocks' rates.
    package var acknowledgeWithin: Duration { .seconds(leaseSeconds) - margin }
    private var margin: Duration { .milliseconds(max(1000, leaseSeconds * 200)) }
    /// How often a held lease is renewed (it is read every second in between).
    package var renewEvery: Duration { .milliseconds(leaseSeconds * 1000 / 3) }
    /// How recent the last look that found the held lease this host's must be for a durable
    /// write to be acknowledged: a holder that was paused (or starved) acknowledges nothing after
    /// it resumes until it has looked again, and one whose lease an operator took over while it
    /// ran stops acknowledging within about this long.
    package static let confirmationWindow = Duration.seconds(3)

    /// `handler` runs (on a background task) when this host loses the lease it held.
    package func onLost(_ handler: @escaping @Sendable () -> Void) { lostHandler.withLock { $0 = handler } }

    /// `handler` runs (on a background task) when this host takes the lease, with its epoch.
    package func onAcquired(_ handler: @escaping @Sendable (Int64) -> Void) { acquiredHandler.withLock { $0 = handler } }

    // MARK: Rounds

    /// Whether the replica was seen to refuse failed conditional writes (probed once, before
    /// the first lease this process writes).
    private let conditionsChecked = Mutex(false)

    /// Checks once that the replica refuses a write whose condition fails; false (with the
    /// problem recorded) when it does not, or could not be asked.
    private func conditionalWritesWork() async -> Bool {
        if conditionsChecked.withLock({ $0 }) { return true }
        do {
            guard try await storage.refusesFailedConditions() else {
                failed("ReplicaNoConditionalWrites: the S3 server ignores If-Match and If-None-Match on PUT; the writer lease needs them (AWS S3, SeaweedFS and moto honour them), so this host takes no lease and serves no store")
                return false
            }
        } catch {
            failed("checking that the replica refuses failed conditional writes: \(error)")
            return false
        }
        conditionsChecked.withLock { $0 = true }
        return true
    }

    /// Keeps the lease until cancelled: a round every second — a read of the lease (a GET),
    /// and while held a renewal (a conditional PUT) every third of the lease. A round under way
    /// when the keeper is cancelled (a stop) finishes first: cut off, a renewal that landed would
    /// leave this host with a version it did not see, and its release would fail.
    package func run() async {
        while !Task.isCancelled {
            _ = await Task { await round() }.value
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// One look at the lease: renews the one held, takes one that may be taken, or records the
    /// holder seen. Returns whether this host holds it afterwards and the renewal succeeded. On
    /// the pool's threads kept for waits (``BlockingPool/executingUrgently(_:)``): a renewal
    /// waits neither for Swift's cooperative pool nor behind the disk work of the daemon's pool.
    @discardableResult
    package func round() async -> Bool {
        await BlockingPool.executingUrgently { await rounds.exclusive { await roundAlone() } }
    }

    private func roundAlone() async -> Bool {
        state.withLock { $0.inRound = true }
        let held = await step()
        state.withLock { state in
            state.inRound = false
            state.lastRound = .now
            if held { state.lastRoundFailed = false }
        }
        return held
    }

    private func step() async -> Bool {
        let started = ContinuousClock.now
        guard identity.verdict.isVerified else {
            // Not this data directory's replica (or not known to be): a lease written there
            // would be meaningless, and the one held is not renewed (it runs out).
            failed(identity.verdict.problem ?? "the replica's marker has not been checked")
            return false
        }
        let current: (lease: ReplicaLease?, version: String?)
        do {
            let object = try await storage.readObject(ReplicaLease.name)
            current = (object.flatMap { ReplicaLease(json: $0.data) }, object?.version)
        } catch {
            failed("\(error)")
            return false
        }
        guard await conditionalWritesWork() else { return false }
        let (held, pending) = state.withLock { ($0.held, $0.pending) }
        // A write whose answer never came may have landed: then it is this host's.
        if let lease = current.lease, let version = current.version, lease.incarnation == incarnation,
           let pending, pending.lease == lease, held?.version != version {
            return await acquired(lease, version: version, started: pending.started, previous: held?.lease)
        }
        if current.version == nil {
            // No lease at all: a new replica, or one that vanished since the marker was last
            // checked (an empty mount point holds no lease either). Read the marker again first.
            let verdict = await identity.check()
            guard verdict.isVerified else {
                // The lease held (if any) is kept: once the replica is back, it is renewed.
                failed(verdict.problem ?? "the replica's marker is gone")
                return false
            }
        }
        if let held {
            guard let version = current.version, isOurs(current.lease, version: version, held: held) else {
                return lost(to: current.lease, version: current.version, held: held.version)
            }
            let due = state.withLock { state -> Bool in
                state.held?.version = version // the same bytes, as this read names them
                guard let renewed = state.renewedAt, started - renewed < renewEvery else { return true }
                state.confirmedAt = started // still this host's: a look, no write
                return false
            }
            guard due else { return true }
            return await write(held.lease.renewed(at: Date()), condition: .matching(version), started: started, previous: held.lease)
        }
        guard let lease = current.lease, let version = current.version else {
            if current.version != nil {
                failed("\(ReplicaLease.name) at the replica's root is not a lease userstored wrote; remove it, or take the replica over")
                return false
            }
            return await write(newLease(epoch: nextEpoch(after: nil)), condition: .absent, started: started, previous: nil)
        }
        let (seenSince, changed) = state.withLock { state -> (ContinuousClock.Instant, Bool) in
            state.problem = nil
            guard state.seen?.version != version else { return (state.seen!.since, false) }
            let changed = state.seen?.lease?.epoch != lease.epoch || state.seen?.lease?.holder != lease.holder
            state.seen = (lease, version, started)
            return (started, changed)
        }
        // Given up, or its process gone from this machine: taken at once — at the same epoch when
        // it was this data directory's own (a restart: nobody else wrote under it since), else at
        // a new one. Otherwise taken only once it was seen unrenewed for its whole lease, and at a
        // new epoch even by the same data directory (a cloned machine, a copied directory).
        let gone = lease.released == true || lease.process?.isGone == true
        if gone {
            let mine = lease.dataDirectory == identity.binding.dataDirectory && lease.holder == host
            var taken = newLease(epoch: mine ? lease.epoch : nextEpoch(after: lease.epoch))
            if mine {
                taken.acquiredAt = lease.acquiredAt
                taken.renewals = lease.renewals + 1
            }
            return await write(taken, condition: .matching(version), started: started, previous: lease)
        }
        if changed { logWaiting(lease) }
        guard ContinuousClock.now - seenSince >= .seconds(lease.leaseSeconds) else { return false }
        return await write(newLease(epoch: nextEpoch(after: lease.epoch)), condition: .matching(version), started: started, previous: lease)
    }

    /// Whether `lease`, read with `version`, is the one this host holds: the version it wrote, or
    /// the same bytes under another form of entity tag (a server whose GET and PUT name them
    /// differently).
    func isOurs(_ lease: ReplicaLease?, version: String, held: (lease: ReplicaLease, version: String)) -> Bool {
        version == held.version || (lease?.incarnation == incarnation && lease == held.lease)
    }

    /// A new epoch above `previous`, above every epoch this data directory held, and at least the
    /// Unix time now.
    private func nextEpoch(after previous: Int64?) -> Int64 {
        let floor = max(previous ?? 0, state.withLock { $0.lastEpoch } ?? 0, identity.binding.lastEpoch ?? 0)
        return ReplicaLease.nextEpoch(after: floor, now: Date())
    }

    /// `userstorectl replication take-over`: takes the lease at once under a new epoch, whoever
    /// holds it (an operator who knows the old host is gone). Returns the lease now held and the
    /// one it replaced.
    package func takeOver() async throws -> (held: ReplicaLease, previous: ReplicaLease?) {
        guard identity.verdict.isVerified else {
            throw TakeOverRefused(description: "the replica is not this data directory's: \(identity.verdict.problem ?? "")")
        }
        return try await BlockingPool.executingUrgently { try await rounds.exclusive { try await takeOverAlone() } }
    }

    private func takeOverAlone() async throws -> (held: ReplicaLease, previous: ReplicaLease?) {
        if let held = state.withLock({ $0.held }), isValid { return (held.lease, nil) }
        let object = try await storage.readObject(ReplicaLease.name)
        let previous = object.flatMap { ReplicaLease(json: $0.data) }
        let started = ContinuousClock.now
        // Still this process's own lease (it could not renew it in time): renewed at its epoch,
        // so that the stores open under it stay valid.
        let own = previous?.incarnation == incarnation
        var lease = newLease(epoch: own ? previous!.epoch : nextEpoch(after: previous?.epoch))
        if own { lease.acquiredAt = previous!.acquiredAt; lease.renewals = previous!.renewals + 1 }
        guard await write(lease, condition: object.map { .matching($0.version) } ?? .absent, started: started,
                    previous: previous, reason: own ? "renewed" : "take-over", fromLiveHolder: !own && previous != nil) else {
            throw TakeOverRefused(description: state.withLock { $0.problem } ?? "the lease changed while it was being taken; retry")
        }
        return (state.withLock { $0.held!.lease }, previous)
    }

    /// Why ``takeOver()`` did not take the lease.
    package struct TakeOverRefused: Error, CustomStringConvertible {
        package let description: String
    }

    /// Gives the lease up (a clean stop, after every store's final sync): another host takes it
    /// at once.
    package func release() async {
        await BlockingPool.executingUrgently { await releaseNow() }
    }

    private func releaseNow() async {
        guard let held = state.withLock({ $0.held }) else { return }
        do {
            if try await storage.writeObject(ReplicaLease.name, held.lease.renewed(at: Date(), released: true).json, condition: .matching(held.version)) != nil {
                logger.notice("gave up the replica's writer lease (epoch \(held.lease.epoch))", metadata: [
                    "event": "replica-lease-released", "epoch": "\(held.lease.epoch)",
                ])
            }
        } catch {
            logger.warning("could not give up the replica's writer lease: \(error); another host takes it over once it runs out", metadata: [
                "event": "replica-lease-released", "error": .string("\(error)"),
            ])
        }
        state.withLock { state in
            state.held = nil
            state.validUntil = nil
        }
    }

    // MARK: Steps

    private func newLease(epoch: Int64) -> ReplicaLease {
        ReplicaLease(holder: host, dataDirectory: identity.binding.dataDirectory, incarnation: incarnation, epoch: epoch,
                     leaseSeconds: leaseSeconds, now: Date())
    }

    /// Writes `lease` by compare-and-swap; on success this host holds it, acknowledging until
    /// `started` plus ``acknowledgeWithin``.
    private func write(_ lease: ReplicaLease, condition: S3Client.WriteCondition, started: ContinuousClock.Instant,
                       previous: ReplicaLease?, reason: String? = nil, fromLiveHolder: Bool = false) async -> Bool {
        state.withLock { $0.pending = (lease, started) }
        let version: String?
        do {
            version = try await storage.writeObject(ReplicaLease.name, lease.json, condition: condition)
        } catch {
            failed("writing the lease: \(error)")
            return false
        }
        state.withLock { $0.pending = nil }
        guard let version else {
            // Another host wrote it first (or a write of this host's landed after all): the next
            // round reads it and decides.
            failed("the lease changed while it was being written")
            return false
        }
        return await acquired(lease, version: version, started: started, previous: previous, reason: reason, fromLiveHolder: fromLiveHolder)
    }

    /// This host holds `lease`. `fromLiveHolder`: taken from a holder that may still run (an
    /// operator's take-over), so its fence waits (``fenceNotBefore``).
    private func acquired(_ lease: ReplicaLease, version: String, started: ContinuousClock.Instant, previous: ReplicaLease?,
                          reason: String? = nil, fromLiveHolder: Bool = false) async -> Bool {
        let wasHeld = state.withLock { state -> Bool in
            defer {
                state.held = (lease, version)
                state.validUntil = started + acknowledgeWithin
                state.renewedAt = started
                state.confirmedAt = started
                state.lastEpoch = lease.epoch
                state.seen = nil
                state.pending = nil
                state.problem = nil
            }
            let wasHeld = state.held?.lease.epoch == lease.epoch && state.held?.lease.incarnation == incarnation
            if !wasHeld { state.acquisitions += 1 }
            // Taken from a live holder: it may acknowledge until its last confirmation — begun
            // before this write landed, so before now — is a window old (a second more for the
            // clocks' rates).
            if fromLiveHolder { state.fenceNotBefore = .now + Self.confirmationWindow + .seconds(1) }
            return wasHeld
        }
        if !wasHeld {
            do {
                try await BlockingPool.run { [identity] in try identity.recordEpoch(lease.epoch) }
            } catch {
                logger.warning("could not record the writer lease's epoch \(lease.epoch) in the data directory: \(error)", metadata: ["event": "replica-lease-held"])
            }
            if let handler = acquiredHandler.withLock({ $0 }) { Task { handler(lease.epoch) } }
            let restart = previous.map { $0.dataDirectory == lease.dataDirectory && $0.holder == host && $0.epoch == lease.epoch } ?? false
            let how = reason ?? (previous == nil ? "new" : restart ? "restart"
                                 : previous!.released == true ? "released" : previous!.process?.isGone == true ? "holder-gone" : "expired")
            logger.notice("holds the replica's writer lease at epoch \(lease.epoch) (\(how)\(previous.map { how == "restart" ? "" : "; it was \($0.summary)" } ?? ""))", metadata: [
                "event": "replica-lease-held", "epoch": "\(lease.epoch)", "reason": .string(how),
                "previous_holder": .string(previous?.holder ?? ""),
            ])
        }
        return true
    }

    /// Another host wrote the lease: this host no longer holds it.
    func lost(to other: ReplicaLease?, version: String?, held expected: String) -> Bool {
        let epoch = state.withLock { state -> Int64? in
            guard let held = state.held, held.version == expected else { return nil }
            state.held = nil
            state.validUntil = nil
            state.losses += 1
            // The new holder, as seen now: Status and the refusals name it.
            if let other, let version { state.seen = (other, version, .now) }
            return held.lease.epoch
        }
        guard let epoch else { return false }
        logger.critical("lost the replica's writer lease (epoch \(epoch)) to \(other?.summary ?? "another host"); serving no store, closing every open one", metadata: [
            "event": "replica-lease-lost", "epoch": "\(epoch)", "holder": .string(other?.holder ?? ""),
        ])
        if let handler = lostHandler.withLock({ $0 }) { Task { handler() } }
        return false
    }

    /// The lease could not be read or written (the replica did not answer, or is not this data
    /// directory's): an outage, during which a held lease's stores are still served.
    func failed(_ problem: String) {
        state.withLock { state in
            state.problem = problem
            state.lastRoundFailed = true
        }
    }

    private func logWaiting(_ lease: ReplicaLease) {
        logger.warning("the replica's writer lease is held by \(lease.summary); serving no store until it is given up, runs out (seen unrenewed for \(lease.leaseSeconds) s) or is taken over (userstorectl replication take-over)", metadata: [
            "event": "replica-lease-waiting", "holder": .string(lease.holder), "epoch": "\(lease.epoch)",
        ])
    }
}
