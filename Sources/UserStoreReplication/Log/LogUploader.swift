import Foundation
import Synchronization
import UserStoreCore

/// The host log's uploader: gathers the records every store appends into one object after
/// another and writes each to the replica (group commit across stores), a bounded number at a
/// time, trying a failed one again until it is stored (docs/design.md, "The host log").
///
/// Records are numbered as they are appended. A store's records go out in order and never two
/// objects at once: a record waits while an object holding an earlier record of its store is
/// being written. So once the object holding a store's record is stored, every earlier record of
/// that store is too (``waitUntilStored(_:until:)``): a durable write waits for its own object
/// only, not for other stores' objects begun before it, and a crash between two objects can
/// never leave a store's later record in the replica without the one before it (a gap no
/// restore could cross). A new object begins as soon as one of the `maxInFlight` slots is free
/// and a record that may go waits — with PUTs in flight, the records that arrive meanwhile go
/// together in the next.
package final class LogUploader: Sendable {
    fileprivate struct Waiter {
        let number: UInt64
        /// Waits for every record up to `number` (``flush(until:)``), not just that one.
        let prefix: Bool
        /// When the wait ends unless the record was stored first (``sweep()``).
        let deadline: ContinuousClock.Instant
        /// Resumed with true once the record (and every one it waits for) is stored, false when
        /// the deadline came first.
        let continuation: CheckedContinuation<Bool, Never>
    }

    fileprivate struct Pending {
        let number: UInt64
        let record: LogRecord
        let appendedAt: ContinuousClock.Instant
    }

    fileprivate struct InFlight {
        let sequence: UInt64
        /// Its records' numbers, ascending, and their stores.
        let numbers: [UInt64]
        let users: Set<String>
        /// When its oldest record was appended.
        let appendedAt: ContinuousClock.Instant
        var done = false
    }

    fileprivate struct State {
        /// Records not in an object yet, by number.
        var pending: [Pending] = []
        var pendingBytes = 0
        var appended: UInt64 = 0
        var sequence: UInt64 = 0
        /// Objects begun and not yet followed by every earlier one stored (done or not).
        var inFlight: [InFlight] = []
        /// The stores with a record in an object being written: their next records wait.
        var busyStores: Set<String> = []
        /// Every record up to this number is stored.
        var stored: UInt64 = 0
        /// Records stored past ``stored`` (an earlier one still pending or being written).
        var storedAhead: Set<UInt64> = []
        /// Every object up to this sequence is stored.
        var storedSequence: UInt64 = 0
        var waiters: [Waiter] = []
        /// One task ends the waits whose deadline passed: it sleeps until the earliest deadline
        /// (`sweepAt`). A task per wait cost a task, a timer and its cancellation per durable
        /// write, and a sleeping task holds its memory until it wakes.
        var sweepAt: ContinuousClock.Instant?
        var sweeper: Task<Void, Never>?
        var work: CheckedContinuation<Void, Never>?
        var objects = 0
        var bytes = 0
        var lastError: String?
        /// The writer lease's epoch objects are written under from now on.
        var epoch: Int64
    }

    package let storage: ReplicaStorage
    package let origin: Origin
    package let settings: Settings
    /// Told of every object stored, with its users.
    package let index: LogIndex?
    /// Told how long each object took, from its first try until it was stored (the metrics'
    /// sync duration: what a durable write waits for).
    package let objectStored: (@Sendable (Duration) -> Void)?
    private let state: Mutex<State>
    /// Broadcast whenever records are stored (``waitOnThisThread(for:until:)``).
    let storedSignal = NSCondition()

    package init(storage: ReplicaStorage, origin: Origin, settings: Settings = Settings(), index: LogIndex? = nil,
                 stored: (@Sendable (Duration) -> Void)? = nil) {
        state = Mutex(State(epoch: origin.epoch))
        self.storage = storage
        self.origin = origin
        self.settings = settings
        self.index = index
        self.objectStored = stored
    }

    /// The key of the object with `sequence` (16 hex digits: listed in order).
    package func key(of sequence: UInt64) -> String {
        origin.folder + String(repeating: "0", count: max(0, 16 - String(sequence, radix: 16).count)) + String(sequence, radix: 16) + ".usl"
    }

    /// Appends `record` to the next object; returns its number, or nil when too much already
    /// waits (``Settings/maxPendingBytes``). Never blocks: called from a store's connection.
    package func append(_ record: LogRecord) -> UInt64? {
        let (number, wake) = state.withLock { state -> (UInt64?, CheckedContinuation<Void, Never>?) in
            guard state.pendingBytes + record.encodedSize <= settings.maxPendingBytes else { return (nil, nil) }
            state.appended += 1
            state.pending.append(Pending(number: state.appended, record: record, appendedAt: .now))
            state.pendingBytes += record.encodedSize
            let wake = state.work
            state.work = nil
            return (state.appended, wake)
        }
        wake?.resume()
        return number
    }

    /// Objects begun from now on are written under `epoch` (a lease taken at a new epoch: a
    /// fence of that epoch voids older-epoch objects it did not list).
    package func raiseEpoch(to epoch: Int64) {
        state.withLock { $0.epoch = max($0.epoch, epoch) }
    }

    /// The epoch objects begun now are written under.
    package var epoch: Int64 { state.withLock { $0.epoch } }

    /// The number of the last record appended (0: none).
    package var appended: UInt64 { state.withLock { $0.appended } }

    /// Every record up to this number is stored.
    package var stored: UInt64 { state.withLock { $0.stored } }

    /// Whether record `number` is stored — and with it every earlier record of its store.
    package func isStored(_ number: UInt64) -> Bool { state.withLock { $0.isStored(number) } }

    /// Every object up to this sequence is stored (0: none yet): the fold takes no later one.
    package var storedSequence: UInt64 { state.withLock { $0.storedSequence } }

    /// The sequence of the last object begun (0: none).
    package var sequenceBegun: UInt64 { state.withLock { $0.sequence } }

    /// Whether the last try to write an object failed (cleared once one is stored): the log
    /// cannot be written now, and a wait for it would last its whole deadline.
    package var isFailing: Bool { state.withLock { $0.lastError != nil } }

    /// Waits until every record appended so far (of every store) is stored, by `deadline`;
    /// false when it came first.
    package func flush(until deadline: ContinuousClock.Instant) async -> Bool {
        await wait(for: appended, prefix: true, until: deadline)
    }

    /// Waits until record `number` — and with it every earlier record of its store — is stored;
    /// false when `deadline` came first.
    package func waitUntilStored(_ number: UInt64, until deadline: ContinuousClock.Instant) async -> Bool {
        await wait(for: number, prefix: false, until: deadline)
    }

    /// Waits until record `number` (with every earlier record of its store; with `prefix`, every
    /// earlier record at all) is stored; false when `deadline` came first.
    private func wait(for number: UInt64, prefix: Bool, until deadline: ContinuousClock.Instant) async -> Bool {
        await withCheckedContinuation { continuation in
            let (stored, sweepAt) = state.withLock { state -> (Bool, ContinuousClock.Instant?) in
                if prefix ? state.stored >= number : state.isStored(number) { return (true, nil) }
                state.waiters.append(Waiter(number: number, prefix: prefix, deadline: deadline, continuation: continuation))
                guard state.sweepAt.map({ deadline < $0 }) ?? true else { return (false, nil) }
                state.sweepAt = deadline
                return (false, deadline)
            }
            if stored { return continuation.resume(returning: true) }
            if let sweepAt { armSweeper(at: sweepAt) }
        }
    }

    /// Starts the task that ends waits at `instant` (``State/sweepAt``), in place of the one
    /// armed for a later instant.
    private func armSweeper(at instant: ContinuousClock.Instant) {
        let task = Task { [weak self] in
            guard (try? await Task.sleep(until: instant)) != nil else { return }
            self?.sweep()
        }
        let replaced = state.withLock { state -> Task<Void, Never>? in
            // Armed for an earlier instant meanwhile: that one stays.
            guard state.sweepAt == instant else { return task }
            defer { state.sweeper = task }
            return state.sweeper
        }
        replaced?.cancel()
    }

    /// Ends every wait whose deadline passed (false: not stored in time), and arms the next.
    private func sweep() {
        let (expired, next) = state.withLock { state -> ([Waiter], ContinuousClock.Instant?) in
            let now = ContinuousClock.now
            let expired = state.waiters.filter { $0.deadline <= now }
            state.waiters.removeAll { $0.deadline <= now }
            state.sweepAt = state.waiters.lazy.map(\.deadline).min()
            state.sweeper = nil
            return (expired, state.sweepAt)
        }
        for waiter in expired { waiter.continuation.resume(returning: false) }
        if let next { armSweeper(at: next) }
    }

    package var snapshot: Snapshot {
        state.withLock { state in
            let oldest = state.oldestUnstored.map { (ContinuousClock.now - $0).inSeconds } ?? 0
            return Snapshot(appended: state.appended, stored: state.stored + UInt64(state.storedAhead.count), objects: state.objects,
                            bytes: state.bytes, pendingBytes: state.pendingBytes, oldestUnstoredSeconds: oldest, lastError: state.lastError)
        }
    }

    // MARK: The loop

    /// Writes objects until cancelled (an object being written is finished first).
    package func run() async {
        await withDiscardingTaskGroup { group in
            while let batch = await nextBatch() {
                group.addTask { await self.upload(batch) }
            }
        }
    }

    /// The next object's records, once some wait and a slot is free; nil once cancelled.
    private func nextBatch() async -> (sequence: UInt64, epoch: Int64, records: [LogRecord])? {
        while !Task.isCancelled {
            let (batch, due) = state.withLock { state -> ((UInt64, Int64, [LogRecord])?, ContinuousClock.Instant?) in
                guard case .now = begins(state), let taken = state.takeBatch(maxBytes: settings.maxObjectBytes) else {
                    if case .at(let due) = begins(state) { return (nil, due) }
                    return (nil, nil)
                }
                state.sequence += 1
                let users = Set(taken.map(\.record.user))
                state.inFlight.append(InFlight(sequence: state.sequence, numbers: taken.map(\.number), users: users, appendedAt: taken[0].appendedAt))
                state.busyStores.formUnion(users)
                return ((state.sequence, state.epoch, taken.map(\.record)), nil)
            }
            if let batch { return batch }
            // Woken by an append, an object stored, or the oldest record's batch time.
            let timer = due.map { due in Task { [weak self] in
                // Cancelled (woken otherwise first): it must not wake the next wait.
                guard (try? await Task.sleep(until: due)) != nil else { return }
                self?.wakeBatcher()
            } }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let ready = state.withLock { state -> Bool in
                        // Cancelled since the look for work: the handler below ran before this
                        // wait began and found none to end (the loop, and the daemon's stop,
                        // waited for the next append). Under the lock it shares with the handler.
                        if Task.isCancelled { return true }
                        if case .now = begins(state) { return true }
                        state.work = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                self.wakeBatcher()
            }
            timer?.cancel()
        }
        return nil
    }

    /// When the next object may begin.
    private enum Beginning { case now, at(ContinuousClock.Instant), never }

    /// Whether an object may begin now: records wait that may go, a slot is free, and no object
    /// is being written or the oldest record has waited `batchMilliseconds`.
    private func begins(_ state: State) -> Beginning {
        guard state.writing < settings.maxInFlight, state.hasBatch else { return .never }
        guard settings.batchMilliseconds > 0, state.writing > 0, let oldest = state.pending.first?.appendedAt else { return .now }
        let due = oldest + .milliseconds(settings.batchMilliseconds)
        return ContinuousClock.now < due ? .at(due) : .now
    }

    /// Resumes the loop that begins objects, if it waits.
    private func wakeBatcher() {
        state.withLock { state in
            defer { state.work = nil }
            return state.work
        }?.resume()
    }

    /// Writes one object, again and again until it is stored (backing off to 5 s between tries)
    /// — or, once the loop is cancelled (the daemon's stop, after its wait for the log), until a
    /// try fails: its records then stay unstored, in their stores' WALs, and ship at their next
    /// open. (Retrying after the cancel spun: a cancelled task's sleep ends at once, and the stop
    /// never ended while the bucket was down.)
    private func upload(_ batch: (sequence: UInt64, epoch: Int64, records: [LogRecord])) async {
        let createdAt = Date()
        let segment = LogSegment(header: .init(kind: "log", host: origin.host, dataDirectory: origin.dataDirectory, incarnation: origin.incarnation,
                                               epoch: batch.epoch, sequence: batch.sequence, createdAt: RFC3339.format(createdAt),
                                               records: 0, users: [], bodyBytes: 0, recordBytes: 0, cluster: origin.cluster ? true : nil),
                                 records: batch.records)
        let bytes = segment.encoded(level: 1)
        let key = key(of: batch.sequence)
        var delay = Duration.milliseconds(100)
        let begun = ContinuousClock.now
        while true {
            do {
                try await storage.put(key, bytes)
                break
            } catch {
                state.withLock { $0.lastError = "writing \(key): \(error)" }
                if Task.isCancelled { return }
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
        objectStored?(ContinuousClock.now - begun)
        index?.add(key, .init(users: Set(batch.records.map(\.user)),
                              position: .init(epoch: batch.epoch, incarnation: origin.incarnation, sequence: batch.sequence),
                              createdAt: RFC3339.parse(RFC3339.format(createdAt)) ?? createdAt))
        let (resumed, wake) = state.withLock { state -> ([Waiter], CheckedContinuation<Void, Never>?) in
            state.objects += 1
            state.bytes += bytes.count
            state.lastError = nil
            if let index = state.inFlight.firstIndex(where: { $0.sequence == batch.sequence }) {
                state.inFlight[index].done = true
                state.storedAhead.formUnion(state.inFlight[index].numbers)
                state.busyStores.subtract(state.inFlight[index].users)
            }
            while let first = state.inFlight.first, first.done {
                state.storedSequence = first.sequence
                state.inFlight.removeFirst()
            }
            state.advanceStored()
            let (stored, ahead) = (state.stored, state.storedAhead)
            func satisfied(_ waiter: Waiter) -> Bool {
                waiter.number <= stored || (!waiter.prefix && ahead.contains(waiter.number))
            }
            let ready = state.waiters.filter(satisfied)
            state.waiters.removeAll(where: satisfied)
            let wake = state.work
            state.work = nil
            return (ready, wake)
        }
        for waiter in resumed { waiter.continuation.resume(returning: true) }
        signalStored()
        wake?.resume()
    }
}

extension LogUploader.State {
    /// Objects being written now.
    var writing: Int { inFlight.count { !$0.done } }

    /// The objects being written now.
    var beingWritten: [LogUploader.InFlight] { inFlight.filter { !$0.done } }

    func isStored(_ number: UInt64) -> Bool { number <= stored || storedAhead.contains(number) }

    /// When the oldest record not stored yet was appended (nil: none).
    var oldestUnstored: ContinuousClock.Instant? {
        ([pending.first?.appendedAt] + beingWritten.map(\.appendedAt)).compactMap { $0 }.min()
    }

    /// Moves ``stored`` up to just below the lowest record still pending or being written.
    mutating func advanceStored() {
        let lowestPending = pending.first?.number
        let lowestWriting = beingWritten.compactMap(\.numbers.first).min()
        stored = [lowestPending, lowestWriting].compactMap { $0 }.min().map { $0 - 1 } ?? appended
        let through = stored
        storedAhead = storedAhead.filter { $0 > through }
    }

    /// Whether a record may go out now: one whose store has no object being written.
    var hasBatch: Bool {
        guard !pending.isEmpty else { return false }
        let busy = busyStores
        return pending.contains { !busy.contains($0.record.user) }
    }

    /// Takes the next object's records out of ``pending``: in order, up to `maxBytes` (at least
    /// one), leaving a store's records where an object holding an earlier one is being written,
    /// and every later record of a store one of whose records was left. Nil when none may go.
    mutating func takeBatch(maxBytes: Int) -> [LogUploader.Pending]? {
        var busy = busyStores
        var taken: [LogUploader.Pending] = [], kept: [LogUploader.Pending] = []
        var bytes = 0
        for item in pending {
            let size = item.record.encodedSize
            if busy.contains(item.record.user) || (!taken.isEmpty && bytes + size > maxBytes) {
                busy.insert(item.record.user) // its later records keep their place behind it
                kept.append(item)
                continue
            }
            taken.append(item)
            bytes += size
        }
        guard !taken.isEmpty else { return nil }
        pending = kept
        pendingBytes -= bytes
        return taken
    }
}
