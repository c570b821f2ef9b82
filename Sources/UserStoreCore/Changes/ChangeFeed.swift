import Synchronization

/// A store's watchers: each committed ``ChangeEvent`` is handed to every subscriber, in commit
/// order, on the thread that committed it (the store's queue) — so a subscriber must only take
/// it and return (a slow watcher must never slow the store's writers).
public final class ChangeFeed: Sendable {
    /// One watcher: its events, and the end of its feed (the store is being closed for a
    /// deletion, a replacement or a move; the watcher lets go of it and watches again).
    public struct Subscriber: Sendable {
        public let event: @Sendable (ChangeEvent) -> Void
        public let end: @Sendable () -> Void

        public init(event: @escaping @Sendable (ChangeEvent) -> Void, end: @escaping @Sendable () -> Void) {
            self.event = event
            self.end = end
        }
    }

    private let subscribers = Mutex<[UInt64: Subscriber]>([:])
    private let nextKey = Atomic<UInt64>(1)

    /// Adds `subscriber`; the key removes it again.
    public func subscribe(_ subscriber: Subscriber) -> UInt64 {
        let key = nextKey.add(1, ordering: .relaxed).newValue
        subscribers.withLock { $0[key] = subscriber }
        return key
    }

    public func unsubscribe(_ key: UInt64) {
        _ = subscribers.withLock { $0.removeValue(forKey: key) }
    }

    func publish(_ event: ChangeEvent) {
        let current = subscribers.withLock { Array($0.values) }
        for subscriber in current { subscriber.event(event) }
    }

    /// Ends every watch (the store is about to close while watched: its leases must go).
    public func endAll() {
        let ended = subscribers.withLock { subscribers in
            defer { subscribers.removeAll() }
            return Array(subscribers.values)
        }
        for subscriber in ended { subscriber.end() }
    }
}
