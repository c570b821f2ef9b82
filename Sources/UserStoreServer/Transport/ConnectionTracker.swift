import Synchronization

/// The open client connections: admission against `limits.maxConnections`, the count for
/// `Status`, and graceful shutdown (ask each connection to finish, wait until all have closed).
final class ConnectionTracker: Sendable {
    enum Admission { case admitted, full, userFull, stopping }

    private struct State {
        var channels: [ObjectIdentifier: Connection] = [:]
        var perUser: [UInt32: Int] = [:]
        var stopping = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    /// Connections admitted and not yet closed.
    var count: Int { state.withLock { $0.channels.count } }

    /// Admits `connection` unless `maximum` connections are open, its Unix user has
    /// `perUser` open, or shutdown has begun.
    func admit(_ connection: Connection, maximum: Int, perUser: Int) -> Admission {
        state.withLock { state in
            if state.stopping { return .stopping }
            guard state.channels.count < maximum else { return .full }
            guard state.perUser[connection.peer.uid, default: 0] < perUser else { return .userFull }
            state.channels[ObjectIdentifier(connection)] = connection
            state.perUser[connection.peer.uid, default: 0] += 1
            return .admitted
        }
    }

    /// Forgets a closed connection.
    func remove(_ channel: Connection) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            if state.channels.removeValue(forKey: ObjectIdentifier(channel)) != nil {
                state.perUser[channel.peer.uid, default: 1] -= 1
                if state.perUser[channel.peer.uid] == 0 { state.perUser[channel.peer.uid] = nil }
            }
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
