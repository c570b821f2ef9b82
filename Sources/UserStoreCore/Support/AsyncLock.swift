import Synchronization

/// A readers–writer lock for async code: work holding it may await (a request to the replica)
/// without blocking a thread. Holders are served first come, first served, so a writer waits
/// only for the readers ahead of it and readers that come after it wait for it. Not reentrant.
///
/// The replica's log holds one around restores (``shared(_:)``) against the fold and the erase
/// that delete objects (``exclusive(_:)``); the writer lease's rounds, the marker's looks and
/// the log's fencing hold one exclusively so that two never race their compare-and-swaps.
package final class AsyncLock: Sendable {
    private struct Waiter {
        let exclusive: Bool
        let continuation: CheckedContinuation<Void, Never>
    }

    private struct State {
        var readers = 0
        var writing = false
        var waiting: [Waiter] = []
    }

    private let state = Mutex(State())

    package init() {}

    /// How many wait for the lock now (for tests).
    var waiting: Int { state.withLock { $0.waiting.count } }

    /// Runs `body` while nobody else holds the lock.
    package func exclusive<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        await acquire(exclusive: true)
        defer { release(exclusive: true) }
        return try await body()
    }

    /// Runs `body` while no ``exclusive(_:)`` holder does (other shared holders may).
    package func shared<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        await acquire(exclusive: false)
        defer { release(exclusive: false) }
        return try await body()
    }

    private func acquire(exclusive: Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = state.withLock { state -> Bool in
                // Behind anyone already waiting: first come, first served.
                guard state.waiting.isEmpty, !state.writing, !exclusive || state.readers == 0 else {
                    state.waiting.append(Waiter(exclusive: exclusive, continuation: continuation))
                    return false
                }
                if exclusive { state.writing = true } else { state.readers += 1 }
                return true
            }
            if granted { continuation.resume() }
        }
    }

    private func release(exclusive: Bool) {
        let woken = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            if exclusive { state.writing = false } else { state.readers -= 1 }
            var woken: [CheckedContinuation<Void, Never>] = []
            while let next = state.waiting.first, !state.writing {
                if next.exclusive {
                    guard state.readers == 0 else { break }
                    state.writing = true
                } else {
                    state.readers += 1
                }
                woken.append(next.continuation)
                state.waiting.removeFirst()
            }
            return woken
        }
        for continuation in woken { continuation.resume() }
    }
}
