import Synchronization
import UserStoreCore
import Varlink

/// An interactive transaction of a connection (at most one). Its `var`s are touched only on the
/// connection's loop (each change asserted in debug builds); other threads (the store's queue,
/// tasks) read only its `let`s — hence `@unchecked Sendable`.
final class OpenTransaction: @unchecked Sendable {
    enum State: Equatable {
        /// `Begin` is waiting for the store.
        case beginning
        case open
        /// Rolled back without the client asking (a time-out, SQLite itself); the next call that
        /// names it learns why.
        case ended(reason: String)
    }

    /// The id the client names it by: 128 random bits, hex.
    let id: String
    let key: Store.TransactionKey
    let user: UserID
    let immediate: Bool
    /// The loop of the connection that owns it, where its `var`s live.
    let loop: EventLoop
    var store: Store? { didSet { assert(loop.inEventLoop) } }
    var state: State = .beginning { didSet { assert(loop.inEventLoop) } }
    /// Calls of the transaction not answered yet (it is not idle while one runs).
    var inFlight = 0 { didSet { assert(loop.inEventLoop) } }
    var idleTimer: Int? { didSet { assert(loop.inEventLoop) } }
    var totalTimer: Int? { didSet { assert(loop.inEventLoop) } }
    let began = StoreClock.now()

    /// Keys of the store holds (transactions and streamed queries), unique in the process.
    static let nextKey = Atomic<UInt64>(1)

    init(user: UserID, immediate: Bool, loop: EventLoop) {
        self.loop = loop
        var random = SystemRandomNumberGenerator()
        id = (0..<2).map { _ in String(random.next() as UInt64, radix: 16) }.map { String(repeating: "0", count: 16 - $0.count) + $0 }.joined()
        key = Store.TransactionKey(Self.nextKey.add(1, ordering: .relaxed).newValue)
        self.user = user
        self.immediate = immediate
    }

    /// Holds its store (beginning or open).
    var isLive: Bool {
        if case .ended = state { return false }
        return true
    }
}
