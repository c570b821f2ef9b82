import GRDB
import Synchronization

/// One user's open store: a single SQLite connection behind its own serial queue.
///
/// All access goes through ``queue``, so statements for one user run one at a time in arrival
/// order; different users' stores run in parallel. Obtain stores from a ``StoreRegistry``,
/// which guarantees one connection per file.
public final class Store: Sendable {
    /// Whose store this is.
    public let user: UserID
    /// The store's file.
    public let path: String
    /// The serial queue (GRDB's `DatabaseQueue`: one connection, one dispatch queue). Use
    /// ``write(_:)`` and ``read(_:)``: they take the connection lock that ``runIfIdle(_:)``
    /// relies on. Direct use is only safe while no request can reach the store.
    public let queue: DatabaseQueue
    /// The connection's authorizer and deadline for client statements.
    public let guardian: StoreGuard
    /// Prepared client statements; use only while holding the connection (in ``write(_:)``,
    /// ``read(_:)`` or ``runIfIdle(_:)``).
    public let statements: StatementCache
    /// Work submitted through ``write(_:)`` or ``read(_:)`` and not finished.
    private let queued = Atomic<Int>(0)
    /// The SQLite connection behind ``queue``; used only under ``connectionLock``.
    nonisolated(unsafe) private let connection: OpaquePointer
    /// Held by whoever uses the connection: work on the queue, or ``runIfIdle(_:)``.
    private let connectionLock = Mutex<Void>(())

    init(user: UserID, path: String, queue: DatabaseQueue, guardian: StoreGuard) {
        self.connection = queue.inDatabase { $0.sqliteConnection! }
        self.user = user
        self.path = path
        self.queue = queue
        self.guardian = guardian
        self.statements = StatementCache()
    }

    /// Runs `body` on the store's serial queue, after the work already queued there.
    public func write<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        queued.add(1, ordering: .relaxed)
        defer { queued.subtract(1, ordering: .relaxed) }
        return try await queue.writeWithoutTransaction { db in try connectionLock.withLock { _ in try body(db) } }
    }

    /// Runs `body` on the store's serial queue with the connection read-only (`PRAGMA
    /// query_only`). No transaction is needed for a consistent view: every write to this file
    /// goes through this queue.
    ///
    /// Not GRDB's `read`: it runs its own statements (query_only, a savepoint and its release)
    /// around `body`, outside the connection lock, so they could meet a ``runIfIdle(_:)``
    /// statement on the same connection (seen as SQLITE_ABORT "abort due to ROLLBACK").
    public func read<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        queued.add(1, ordering: .relaxed)
        defer { queued.subtract(1, ordering: .relaxed) }
        return try await queue.writeWithoutTransaction { db in try connectionLock.withLock { _ in try db.readOnly { try body(db) } } }
    }

    /// Runs `body` on the store's serial queue after the work already queued there, then hands
    /// its result to `completion` (on the queue's thread) — without a task or a wait: the
    /// callback form of ``write(_:)``, for the event loops.
    public func enqueue<T: Sendable>(_ body: @escaping @Sendable (Database) -> T, completion: @escaping @Sendable (T) -> Void) {
        queued.add(1, ordering: .relaxed)
        queue.asyncWriteWithoutTransaction { [self] db in
            let result = connectionLock.withLock { _ in body(db) }
            // Before the completion: the caller's next request may find the store idle.
            queued.subtract(1, ordering: .relaxed)
            completion(result)
        }
    }

    /// Runs `body` on the calling thread, waiting for work in progress; for a store nobody
    /// else can reach yet (being opened), where a hop to the queue's thread would only add
    /// latency. Blocks: never call it on an event loop or the cooperative pool.
    func writeBlocking<T: Sendable>(_ body: (Database) throws -> T) throws -> T {
        try connectionLock.withLock { _ in try queue.inDatabase(body) }
    }

    /// Runs `body` right now on the calling thread with the raw connection when no other work
    /// is queued on the store or running, and returns nil without running it otherwise (it
    /// never waits).
    ///
    /// This is the request fast path: a point query on an idle store costs a few microseconds,
    /// while hopping to the queue's thread and back costs two thread wake-ups. Queued work
    /// goes first (order is kept), and work queued while `body` runs waits for it on the
    /// queue's thread. The caller must keep `body` short and leave no transaction open.
    public func runIfIdle<T>(_ body: (OpaquePointer) throws -> T) rethrows -> T? {
        guard queued.load(ordering: .relaxed) == 0 else { return nil }
        return try connectionLock.withLockIfAvailable { _ in try body(connection) }
    }

    /// Closes the connection after the work already queued on it.
    func close() {
        let statements = self.statements
        queue.writeWithoutTransaction { _ in statements.finalizeAll() }
        try? queue.close()
    }
}

extension Store {
    /// The store's schema version (`PRAGMA user_version`), read on its queue.
    public func schemaVersion() async throws -> Int64 {
        try await read { db in try Bookkeeping.userVersion(db) }
    }

    /// The store's `app_version` row when the store is idle (read right here, without waiting);
    /// nil when it is busy or the row cannot be read (``versionInfo()`` then says why).
    public func versionInfoIfIdle() -> StoreVersionInfo? {
        guard let row = try? runIfIdle({ connection in try Bookkeeping.read(connection: connection) }) else { return nil }
        return row
    }

    /// The store's `app_version` row: read right here when the store is idle, else on its queue.
    public func versionInfo() async throws -> StoreVersionInfo {
        var row = try runIfIdle { connection in try Bookkeeping.read(connection: connection) }
        if row == nil { row = try await self.read { db in try Bookkeeping.read(db) } }
        guard let row = row ?? nil else { throw StoreError.storeDamaged(user: user, message: "the app_version table is missing") }
        return row
    }
}
