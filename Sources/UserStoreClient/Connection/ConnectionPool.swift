import Logging
import NIOCore
import Synchronization
import Varlink

/// Up to `size` connections to the daemon, opened as load needs them.
///
/// Ordinary calls share connections and pipeline on them: a call goes to the live connection
/// with the fewest calls in flight, and a new connection is opened while every live one is busy
/// and a slot is free. A transaction or a streamed query takes a connection for itself
/// (exclusive): a varlink transaction belongs to its connection, and a stream's replies would
/// hold up every call behind it. When every connection is exclusive, calls wait their turn.
///
/// A connection that breaks is dropped, and the next call opens another. A failed connect puts
/// the whole pool in back-off (doubling from `reconnectDelay.min` to `.max`); in back-off a call
/// with no live connection fails at once with ``UserStoreError/Kind/connectionFailed``: the pool
/// never hides an error by waiting.
final class ConnectionPool: Sendable {
    struct Configuration: Sendable {
        var socketPath: String
        var size: Int
        var minimumReconnectDelay: TimeAmount
        var maximumReconnectDelay: TimeAmount
        var maxMessageBytes: Int
    }

    /// A connection held by a caller until ``ConnectionPool/release(_:)``.
    struct Lease: Sendable {
        let slot: Int
        let generation: UInt64
        let connection: ClientConnection
        let exclusive: Bool
    }

    private struct Slot {
        var connection: ClientConnection?
        var connecting = false
        var inFlight = 0
        var exclusive = false
        /// Counts the slot's connections, so a lease of a closed one changes nothing when released.
        var generation: UInt64 = 0

        /// Puts `connection` (a new one, or none) in the slot, with no calls and no holder.
        mutating func replace(with connection: ClientConnection?) {
            self.connection = connection
            generation += 1
            inFlight = 0
            exclusive = false
        }
    }

    private struct State {
        var slots: [Slot]
        var waiters: [UInt64: CheckedContinuation<Void, any Error>] = [:]
        var nextWaiter: UInt64 = 0
        /// Counts wake-ups, so a caller that decided to wait sees one that came before it
        /// registered (and looks again instead of sleeping through it).
        var wakeups: UInt64 = 0
        var failures = 0
        var retryAt = NIODeadline.uptimeNanoseconds(0)
        /// The end of back-off a wake-up is already scheduled for (one per back-off, however
        /// many callers wait it out).
        var wakeScheduledAt: NIODeadline?
        var lastFailure = ""
        var lastFailureCode: Int32?
        var shutDown = false
    }

    /// What ``acquire(exclusive:)`` should do next, decided under the lock.
    private enum Step {
        case leased(Lease)
        case connect(slot: Int)
        /// Wait for a wake-up after the `seen`th; `wakeAt`: schedule one then (the back-off ends).
        case wait(seen: UInt64, wakeAt: NIODeadline?)
        case fail(UserStoreError)
    }

    let configuration: Configuration
    private let logger: Logger
    private let state: Mutex<State>

    init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        state = Mutex(State(slots: Array(repeating: Slot(), count: max(1, configuration.size))))
    }

    /// A connection for one call (shared) or for a transaction or stream (`exclusive`).
    func acquire(exclusive: Bool) async throws -> Lease {
        while true {
            try Task.checkCancellation()
            switch state.withLock({ next(&$0, exclusive: exclusive) }) {
            case .leased(let lease):
                return lease
            case .fail(let error):
                throw error
            case .connect(let slot):
                do {
                    let connection = try await ClientConnection.connect(
                        to: configuration.socketPath, loop: try ClientLoop.next(), maxMessageBytes: configuration.maxMessageBytes
                    ) { [weak self] connection in self?.dropped(slot: slot, connection: connection) }
                    connected(connection, slot: slot)
                } catch {
                    connectFailed(slot: slot, error)
                    throw UserStoreError.connectFailed("cannot connect to \(configuration.socketPath): \(Self.describe(error))",
                                                       systemError: Self.code(error))
                }
            case .wait(let seen, let wakeAt):
                if let wakeAt { wakeWaiters(at: wakeAt) }
                try await waitForRelease(seen: seen)
            }
        }
    }

    private func next(_ state: inout State, exclusive: Bool) -> Step {
        guard !state.shutDown else { return .fail(.shutDown()) }
        var best: Int?
        for index in state.slots.indices {
            // A connection closed by its holder or a failed write is useless at once, before the
            // loop has released it (its `dropped` then changes nothing).
            if state.slots[index].connection?.isClosed == true { state.slots[index].replace(with: nil) }
            let slot = state.slots[index]
            guard slot.connection != nil, !slot.exclusive else { continue }
            if best == nil || slot.inFlight < state.slots[best!].inFlight { best = index }
        }
        let free = state.slots.firstIndex { $0.connection == nil && !$0.connecting }
        let mayConnect = free != nil && NIODeadline.now() >= state.retryAt
        if let best, state.slots[best].inFlight == 0 || !mayConnect {
            state.slots[best].inFlight += 1
            if exclusive { state.slots[best].exclusive = true }
            let slot = state.slots[best]
            return .leased(Lease(slot: best, generation: slot.generation, connection: slot.connection!, exclusive: exclusive))
        }
        if mayConnect, let free {
            state.slots[free].connecting = true
            return .connect(slot: free)
        }
        if state.slots.contains(where: { $0.connection != nil || $0.connecting }) {
            // Backing off with a free slot: someone must be woken when connecting is allowed again.
            let scheduleWake = free != nil && state.wakeScheduledAt != state.retryAt
            if scheduleWake { state.wakeScheduledAt = state.retryAt }
            return .wait(seen: state.wakeups, wakeAt: scheduleWake ? state.retryAt : nil)
        }
        let wait = max(0, (state.retryAt - .now()).nanoseconds / 1_000_000)
        return .fail(.connectFailed("cannot connect to \(configuration.socketPath): \(state.lastFailure) (next attempt in \(wait) ms)",
                                    systemError: state.lastFailureCode))
    }

    private func connected(_ connection: ClientConnection, slot index: Int) {
        let kept = state.withLock { state -> Bool in
            state.slots[index].connecting = false
            state.failures = 0
            // Closed already (shut down meanwhile, or the daemon hung up at once): its
            // `dropped` came before it was in the slot, so it must not go in.
            guard !state.shutDown, !connection.isClosed else { return false }
            state.slots[index].replace(with: connection)
            return true
        }
        if !kept { connection.close(.shutDown()) }
        wakeWaiters()
    }

    private func connectFailed(slot index: Int, _ error: any Error) {
        let delay = state.withLock { state -> TimeAmount in
            state.slots[index].connecting = false
            state.failures += 1
            let doubled = configuration.minimumReconnectDelay.nanoseconds << min(state.failures - 1, 20)
            let delay = TimeAmount.nanoseconds(min(doubled, configuration.maximumReconnectDelay.nanoseconds))
            state.retryAt = .now() + delay
            state.lastFailure = Self.describe(error)
            state.lastFailureCode = Self.code(error)
            return delay
        }
        logger.warning("cannot connect to the daemon", metadata: ["socket": "\(configuration.socketPath)", "error": "\(Self.describe(error))",
                                                                  "retryInMilliseconds": "\(delay.nanoseconds / 1_000_000)"])
        wakeWaiters()
    }

    /// A connection closed: its slot is free for a new one.
    private func dropped(slot index: Int, connection: ClientConnection) {
        let wasLive = state.withLock { state -> Bool in
            guard state.slots[index].connection === connection else { return false }
            state.slots[index].replace(with: nil)
            return true
        }
        if wasLive {
            logger.debug("connection to the daemon closed", metadata: ["slot": "\(index)"])
            wakeWaiters()
        }
    }

    /// Gives a connection back; with `discard`, its holder is closing it (a stream stopped
    /// half-way, a transaction in an unknown state): no other call may use it from now on.
    func release(_ lease: Lease, discard: Bool = false) {
        let exclusiveEnded = state.withLock { state -> Bool in
            guard state.slots[lease.slot].generation == lease.generation, state.slots[lease.slot].connection != nil else { return false }
            if discard {
                state.slots[lease.slot].replace(with: nil)
                return true
            }
            state.slots[lease.slot].inFlight -= 1
            if lease.exclusive { state.slots[lease.slot].exclusive = false }
            return lease.exclusive
        }
        if discard { lease.connection.close() }
        if exclusiveEnded { wakeWaiters() }
    }

    /// Waits until a connection is released, opened or dropped after the `seen`th wake-up
    /// (then the caller looks again).
    private func waitForRelease(seen: UInt64) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: (any Error)?? = state.withLock { state in
                    if state.shutDown { return .some(UserStoreError.shutDown()) }
                    if Task.isCancelled { return .some(CancellationError()) }
                    if state.wakeups != seen { return .some(nil) }
                    state.waiters[id] = continuation
                    return .none
                }
                switch resumeNow {
                case .some(.some(let error)): continuation.resume(throwing: error)
                case .some(.none): continuation.resume()
                case .none: break
                }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(throwing: CancellationError())
        }
    }

    /// Wakes the waiters at `deadline` (when a back-off ends, so they may connect).
    private func wakeWaiters(at deadline: NIODeadline) {
        let delay = max(0, (deadline - .now()).nanoseconds)
        Task { [weak self] in
            try? await Task.sleep(nanoseconds: UInt64(delay))
            self?.wakeWaiters()
        }
    }

    private func wakeWaiters() {
        let waiters = state.withLock { state in
            state.wakeups &+= 1
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Closes every connection; calls in flight fail with ``UserStoreError/Kind/connectionClosed``
    /// and later ones with ``UserStoreError/Kind/clientShutDown``.
    func shutdown() async {
        let (connections, waiters) = state.withLock { state in
            state.shutDown = true
            defer { state.waiters.removeAll() }
            return (state.slots.compactMap(\.connection), Array(state.waiters.values))
        }
        for waiter in waiters { waiter.resume(throwing: UserStoreError.shutDown()) }
        for connection in connections { connection.close(.closed("the client shut down before the reply came; the call may or may not have run")) }
    }

    /// How many connections are open now (for tests and status).
    var openConnections: Int { state.withLock { $0.slots.filter { $0.connection != nil }.count } }

    /// The `errno` of a failed connect.
    static func code(_ error: any Error) -> Int32? {
        if case .system(_, let code)? = error as? TransportError { return code }
        return nil
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? TransportError { return error.description }
        return "\(error)"
    }
}
