import Synchronization

/// The open client connections: admission against `limits.maxConnections`, the count for
/// `Status`, and graceful shutdown (ask each connection to finish, wait until all have closed).
final class ConnectionTracker: Sendable {
    enum Admission { case admitted, full, stopping }

    private struct State {
        var channels: [ObjectIdentifier: Connection] = [:]
        var stopping = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    /// Connections admitted and not yet closed.
    var count: Int { state.withLock { $0.channels.count } }

    /// Admits `connection` unless `maximum` connections are open or shutdown has begun.
    func admit(_ connection: Connection, maximum: Int) -> Admission {
        state.withLock { state in
            if state.stopping { return .stopping }
            guard state.channels.count < maximum else { return .full }
            state.channels[ObjectIdentifier(connection)] = connection
            return .admitted
        }
    }

    /// Forgets a closed connection.
    func remove(_ channel: Connection) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.channels[ObjectIdentifier(channel)] = nil
            guard state.channels.isEmpty else { return [] }
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Admits no more connections, asks every open one to finish (``Connection/quiesce()``: an
    /// idle connection closes at once, a busy one after the replies to the calls it started),
    /// and returns when all are closed.
    func quiesce() async {
        let channels = state.withLock { state in
            state.stopping = true
            return Array(state.channels.values)
        }
        for connection in channels {
            connection.loop.execute { connection.quiesce() }
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state in
                if state.channels.isEmpty { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }
}
