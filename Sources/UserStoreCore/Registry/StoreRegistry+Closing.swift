import Foundation
import GRDB
import GRDBSQLite
import Synchronization

/// Closing a store for an operation on its files (``StoreLifecycle``) or for a bucket that
/// moves to another host: requests for that user wait and are answered after it, never in the
/// middle.
extension StoreRegistry {
    /// Runs `operation` while nobody uses `user`'s store (in a task: its blocking file work
    /// belongs on the blocking pool, ``BlockingPool/run(_:)``): requests that arrive meanwhile wait,
    /// work in flight finishes first, the store is closed (a checkpoint: no WAL is left), and
    /// afterwards the next request opens the files as `operation` left them — migrating them
    /// as usual.
    ///
    /// `replacingFiles`: `operation` replaces or removes the store's files, so a damage found in
    /// the old ones no longer counts once it succeeds (``RegistryState/damaged``).
    ///
    /// The caller must not hold a lease on the store itself.
    func withStoreClosed<T: Sendable>(_ user: UserID, replacingFiles: Bool = false,
                                      _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        let outcome = ResultBox<T>()
        while true {
            let (busy, mine) = state.withLock { state -> (Task<PreparationOutcome, Never>?, Task<PreparationOutcome, Never>?) in
                if let task = state.preparation(of: user) { return (task, nil) }
                if state.closing[user] != nil { return (nil, nil) } // being closed: waited for below
                let store = state.entries[user]?.store
                let task = Task<PreparationOutcome, Never> {
                    if let store {
                        store.recorder?.feed.endAll() // a watch's lease would hold the store open
                        await self.drain(user)
                        await self.preparer.close(store)
                    }
                    let result: Result<T, any Error>
                    do { result = .success(try await operation()) } catch { result = .failure(error) }
                    outcome.set(result)
                    self.state.withLock { state in
                        state.removeForClosing(user)
                        if replacingFiles, case .success = result { state.damaged[user] = nil }
                        state.freeSlots(store != nil ? 1 : 0)
                    }
                    return .prepared(nil)
                }
                if var entry = state.entries[user] {
                    entry.phase = .preparing(task)
                    state.entries[user] = entry
                } else {
                    state.entries[user] = RegistryEntry<Store>(store: nil, phase: .preparing(task), tick: state.tick)
                }
                return (nil, task)
            }
            if let busy {
                _ = await busy.value
                continue
            }
            guard let mine else {
                await waitForClose(of: user)
                continue
            }
            _ = await mine.value
            return try outcome.get()
        }
    }

    /// Closes the open stores of every user `matching` accepts, each once the requests holding
    /// it are done (and, replicated, after its final sync); returns how many it closed. A store
    /// still being opened is waited for and closed too — the request that opened it is answered
    /// first (refused, when ``StorePlacement`` refuses its user by then) —, and one being closed
    /// already (idle, evicted) is waited for. Closes ``closingWidth`` stores at a time. For a
    /// bucket that moves to another host, or a writer lease lost: ``StorePlacement`` refuses
    /// new requests first.
    @discardableResult
    public func closeStores(matching: (UserID) -> Bool) async -> Int {
        var closed = 0
        // Looked at again after each round: a request admitted just before its user was refused
        // may have begun an open after the look (at most a few rounds: nothing new is admitted).
        for _ in 0..<Self.closingRounds {
            let (users, closing) = state.withLock { state in
                (state.entries.compactMap { $1.store != nil || $1.preparation != nil ? $0 : nil }.filter(matching),
                 state.closing.keys.filter(matching))
            }
            if users.isEmpty && closing.isEmpty { break }
            closed += await closeConcurrently(users)
            for user in closing { await waitForClose(of: user) }
        }
        return closed
    }

    /// How many times ``closeStores(matching:)`` looks for stores to close.
    static let closingRounds = 3

    /// Closes `users`' stores, ``closingWidth`` at a time, each once its open (if one is under
    /// way) is done; returns how many it closed.
    private func closeConcurrently(_ users: [UserID]) async -> Int {
        await Self.closingSeveral(users) { user in
            // Being opened (or migrated): that first, so that the count says what was closed.
            if let task = self.state.withLock({ $0.preparation(of: user) }) { _ = await task.value }
            guard self.state.withLock({ $0.entries[user]?.store != nil }) else { return false }
            return (try? await self.withStoreClosed(user) {}) != nil
        }
    }

    /// Runs `close` for each of `items`, ``closingWidth`` at a time: each close waits for its
    /// checkpoint's fsync (and, replicated, for its last records), which the others need not
    /// wait for. Returns how many returned true.
    @discardableResult
    static func closingSeveral<T: Sendable>(_ items: [T], _ close: @escaping @Sendable (T) async -> Bool) async -> Int {
        await withTaskGroup(of: Bool.self) { group in
            var closed = 0
            for (index, item) in items.enumerated() {
                if index >= closingWidth, await group.next() == true { closed += 1 }
                group.addTask { await close(item) }
            }
            return await group.reduce(closed) { $0 + ($1 ? 1 : 0) }
        }
    }

    /// The outcome of an operation run in another task.
    private final class ResultBox<T: Sendable>: Sendable {
        private let result = Mutex<Result<T, any Error>?>(nil)
        func set(_ value: Result<T, any Error>) { result.withLock { $0 = value } }
        func get() throws -> T { try result.withLock { $0! }.get() }
    }

    /// Waits until `user`'s store, taken out to be closed, is closed (at once when it is not).
    func waitForClose(of user: UserID) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            if !state.withLock({ $0.waitForClose(of: user, continuation) }) { continuation.resume() }
        }
    }

    /// Waits until no request holds `user`'s store.
    private func drain(_ user: UserID) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                guard let index = state.entries.index(forKey: user), state.entries.values[index].leases > 0 else { return true }
                state.entries.values[index].drainWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }
}
