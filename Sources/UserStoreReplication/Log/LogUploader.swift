import Foundation
import Synchronization
import UserStoreCore

/// The host log's uploader: gathers the records every store appends into one object after
/// another and writes each to the replica (group commit across stores), a bounded number at a
/// time, trying a failed one again until it is stored (docs/design.md, "The host log").
///
/// Records are numbered as they are appended. A record counts as stored once the object holding
/// it *and every object begun before it* is stored (``stored``): so a durable write that waits
/// for its store's last record waits for every earlier commit of that store too. A new object
/// begins as soon as one of the `maxInFlight` slots is free and a record waits — with one PUT
/// in flight, the records that arrive meanwhile go together in the next.
package final class LogUploader: Sendable {
    /// How the uploader batches.
    package struct Settings: Sendable {
        /// Objects being written at once.
        package var maxInFlight = 4
        /// An object closes at this many bytes of records (more wait for the next).
        package var maxObjectBytes = 16 << 20
        /// Records waiting to be written, past which ``append(_:)`` refuses more (the replica has
        /// been down long): the caller ships those stores whole once it is back.
        package var maxPendingBytes = 256 << 20

        package init() {}
    }

    /// What an object is written with, besides its records.
    package struct Origin: Sendable {
        package var host: String
        package var dataDirectory: String
        package var incarnation: String
        package var epoch: Int64
        /// The folder its objects go to (`log/…/`), ending in `/`.
        package var folder: String

        package init(host: String, dataDirectory: String, incarnation: String, epoch: Int64, folder: String) {
            self.host = host
            self.dataDirectory = dataDirectory
            self.incarnation = incarnation
            self.epoch = epoch
            self.folder = folder
        }
    }

    /// What `Status` and the metrics show of the uploader.
    package struct Snapshot: Sendable, Equatable {
        /// Records appended and stored since start.
        package var appended: UInt64
        package var stored: UInt64
        /// Objects written and bytes put since start.
        package var objects: Int
        package var bytes: Int
        /// Records waiting, and how long the oldest not yet stored has waited.
        package var pendingBytes: Int
        package var oldestUnstoredSeconds: Double
        /// The last failure writing an object, while objects fail.
        package var lastError: String?
    }

    private struct Waiter {
        let id: UInt64
        let number: UInt64
        /// Resumed with when the object holding the record (and every one before) was stored,
        /// nil when the deadline came first.
        let continuation: CheckedContinuation<ContinuousClock.Instant?, Never>
    }

    private struct InFlight {
        let sequence: UInt64
        let through: UInt64
        var done = false
    }

    private struct State {
        var pending: [LogRecord] = []
        var pendingBytes = 0
        /// When each pending or unstored record was appended, by number (the oldest first).
        var appendedAt: [(number: UInt64, at: ContinuousClock.Instant)] = []
        var appended: UInt64 = 0
        var sequence: UInt64 = 0
        var inFlight: [InFlight] = []
        var stored: UInt64 = 0
        /// Every object up to this sequence is stored.
        var storedSequence: UInt64 = 0
        /// When ``stored`` last moved.
        var storedAt = ContinuousClock.now
        var waiters: [Waiter] = []
        var nextWaiter: UInt64 = 0
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
    private let state: Mutex<State>

    package init(storage: ReplicaStorage, origin: Origin, settings: Settings = Settings(), index: LogIndex? = nil) {
        state = Mutex(State(epoch: origin.epoch))
        self.storage = storage
        self.origin = origin
        self.settings = settings
        self.index = index
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
            state.pending.append(record)
            state.pendingBytes += record.encodedSize
            state.appendedAt.append((state.appended, .now))
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

    /// Every object up to this sequence is stored (0: none yet): the fold takes no later one.
    package var storedSequence: UInt64 { state.withLock { $0.storedSequence } }

    /// The sequence of the last object begun (0: none).
    package var sequenceBegun: UInt64 { state.withLock { $0.sequence } }

    /// Waits until every record appended so far is stored, by `deadline`; false when it came first.
    package func flush(until deadline: ContinuousClock.Instant) async -> Bool {
        await waitUntilStored(appended, until: deadline)
    }

    /// Waits until record `number` (and every record before it) is stored; false when
    /// `deadline` came first.
    package func waitUntilStored(_ number: UInt64, until deadline: ContinuousClock.Instant) async -> Bool {
        await storedInstant(of: number, until: deadline) != nil
    }

    /// Waits until record `number` (and every record before it) is stored, and returns an
    /// instant at or after which it was (when the object that completed it was stored, or for a
    /// record stored before the call, when the stored records last grew): a look at the writer
    /// lease begun then is one every durable write of that object can share. Nil when
    /// `deadline` came first.
    package func storedInstant(of number: UInt64, until deadline: ContinuousClock.Instant) async -> ContinuousClock.Instant? {
        await withCheckedContinuation { continuation in
            let (id, at) = state.withLock { state -> (UInt64?, ContinuousClock.Instant) in
                if state.stored >= number { return (nil, state.storedAt) }
                state.nextWaiter += 1
                state.waiters.append(Waiter(id: state.nextWaiter, number: number, continuation: continuation))
                return (state.nextWaiter, state.storedAt)
            }
            guard let id else { return continuation.resume(returning: at) }
            Task {
                try? await Task.sleep(until: deadline)
                let timedOut = self.state.withLock { state -> Waiter? in
                    guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: index)
                }
                timedOut?.continuation.resume(returning: nil)
            }
        }
    }

    package var snapshot: Snapshot {
        state.withLock { state in
            let oldest = state.appendedAt.first.map { (ContinuousClock.now - $0.at).inSeconds } ?? 0
            return Snapshot(appended: state.appended, stored: state.stored, objects: state.objects, bytes: state.bytes,
                            pendingBytes: state.pendingBytes, oldestUnstoredSeconds: oldest, lastError: state.lastError)
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
            let batch = state.withLock { state -> (UInt64, Int64, [LogRecord])? in
                guard !state.pending.isEmpty, state.inFlight.count < settings.maxInFlight else { return nil }
                var bytes = 0, count = 0
                for record in state.pending {
                    if count > 0 && bytes + record.encodedSize > settings.maxObjectBytes { break }
                    bytes += record.encodedSize
                    count += 1
                }
                let records = Array(state.pending.prefix(count))
                state.pending.removeFirst(count)
                state.pendingBytes -= bytes
                state.sequence += 1
                state.inFlight.append(InFlight(sequence: state.sequence, through: state.appended - UInt64(state.pending.count)))
                return (state.sequence, state.epoch, records)
            }
            if let batch { return batch }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let ready = state.withLock { state -> Bool in
                        if !state.pending.isEmpty && state.inFlight.count < settings.maxInFlight { return true }
                        state.work = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                self.state.withLock { state in
                    defer { state.work = nil }
                    return state.work
                }?.resume()
            }
        }
        return nil
    }

    /// Writes one object, again and again until it is stored (backing off to 5 s between tries).
    private func upload(_ batch: (sequence: UInt64, epoch: Int64, records: [LogRecord])) async {
        let createdAt = Date()
        let segment = LogSegment(header: .init(kind: "log", host: origin.host, dataDirectory: origin.dataDirectory, incarnation: origin.incarnation,
                                               epoch: batch.epoch, sequence: batch.sequence, createdAt: RFC3339.format(createdAt),
                                               records: 0, users: [], bodyBytes: 0, recordBytes: 0),
                                 records: batch.records)
        let bytes = segment.encoded(level: 1)
        let key = key(of: batch.sequence)
        var delay = Duration.milliseconds(100)
        while true {
            do {
                try await BlockingPool.run { [storage] in try storage.put(key, bytes) }
                break
            } catch {
                state.withLock { $0.lastError = "writing \(key): \(error)" }
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(5))
            }
        }
        index?.add(key, .init(users: Set(batch.records.map(\.user)),
                              position: .init(epoch: batch.epoch, incarnation: origin.incarnation, sequence: batch.sequence),
                              createdAt: RFC3339.parse(RFC3339.format(createdAt)) ?? createdAt))
        let storedAt = ContinuousClock.now
        let (resumed, wake) = state.withLock { state -> ([Waiter], CheckedContinuation<Void, Never>?) in
            state.objects += 1
            state.bytes += bytes.count
            state.lastError = nil
            if let index = state.inFlight.firstIndex(where: { $0.sequence == batch.sequence }) { state.inFlight[index].done = true }
            while let first = state.inFlight.first, first.done {
                state.stored = first.through
                state.storedSequence = first.sequence
                state.storedAt = storedAt
                state.inFlight.removeFirst()
            }
            let storedThrough = state.stored
            state.appendedAt.removeFirst(state.appendedAt.prefix { $0.number <= storedThrough }.count)
            let stored = state.stored
            let ready = state.waiters.filter { $0.number <= stored }
            state.waiters.removeAll { $0.number <= stored }
            let wake = state.work
            state.work = nil
            return (ready, wake)
        }
        for waiter in resumed { waiter.continuation.resume(returning: storedAt) }
        wake?.resume()
    }
}
