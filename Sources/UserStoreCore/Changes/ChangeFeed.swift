import Synchronization

/// A store's watchers: each committed ``ChangeEvent`` is handed to every subscriber, in commit
/// order, on the thread that committed it (the store's queue) — so a subscriber must only take
/// it and return (a slow watcher must never slow the store's writers).
public final class ChangeFeed: Sendable {
    public typealias Subscriber = @Sendable (ChangeEvent) -> Void

    private let subscribers = Mutex<[UInt64: Subscriber]>([:])
    private let nextKey = Atomic<UInt64>(1)

    /// Adds `subscriber`; the key removes it again.
    public func subscribe(_ subscriber: @escaping Subscriber) -> UInt64 {
        let key = nextKey.add(1, ordering: .relaxed).newValue
        subscribers.withLock { $0[key] = subscriber }
        return key
    }

    public func unsubscribe(_ key: UInt64) {
        _ = subscribers.withLock { $0.removeValue(forKey: key) }
    }

    /// Whether nobody watches.
    public var isEmpty: Bool { subscribers.withLock { $0.isEmpty } }

    /// How many watch.
    public var count: Int { subscribers.withLock { $0.count } }

    func publish(_ event: ChangeEvent) {
        let current = subscribers.withLock { Array($0.values) }
        for subscriber in current { subscriber(event) }
    }
}
