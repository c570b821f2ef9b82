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
    /// The serial queue (GRDB's `DatabaseQueue`: one connection, one dispatch queue). Prefer
    /// ``write(_:)``, ``read(_:)`` and ``runIfIdle(_:)``: they keep the count that lets a short
    /// request run on the caller's thread instead of hopping to the queue.
    public let queue: DatabaseQueue
    /// The connection's authorizer and deadline for client statements.
    public let guardian: StoreGuard
    /// Prepared client statements; use only on ``queue``.
    public let statements: StatementCache
    /// Work submitted through ``write(_:)``, ``read(_:)`` or ``runIfIdle(_:)`` and not finished.
    private let activity = Atomic<Int>(0)

    init(user: UserID, path: String, queue: DatabaseQueue, guardian: StoreGuard) {
        self.user = user
        self.path = path
        self.queue = queue
        self.guardian = guardian
        self.statements = StatementCache()
    }

    /// Runs `body` on the store's serial queue, after the work already queued there.
    public func write<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        activity.add(1, ordering: .acquiringAndReleasing)
        defer { activity.subtract(1, ordering: .acquiringAndReleasing) }
        return try await queue.writeWithoutTransaction(body)
    }

    /// Runs `body` on the store's serial queue in a read-only transaction.
    public func read<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        activity.add(1, ordering: .acquiringAndReleasing)
        defer { activity.subtract(1, ordering: .acquiringAndReleasing) }
        return try await queue.read(body)
    }

    /// Runs `body` right now on the calling thread when nothing else is queued on the store,
    /// and returns nil without running it otherwise (never waits).
    ///
    /// This is the request fast path: a point query on an idle store costs a few microseconds,
    /// while hopping to the queue's thread and back costs two thread wake-ups. Serial order
    /// still holds: work submitted meanwhile queues behind `body` (GRDB's synchronous access
    /// runs an idle queue's work on the caller's thread). The caller must keep `body` short.
    public func runIfIdle<T>(_ body: (Database) throws -> T) rethrows -> T? {
        guard activity.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged else { return nil }
        defer { activity.subtract(1, ordering: .acquiringAndReleasing) }
        return try queue.inDatabase(body)
    }

    /// Closes the connection after the work already queued on it.
    func close() {
        let statements = self.statements
        queue.writeWithoutTransaction { _ in statements.finalizeAll() }
        try? queue.close()
    }
}

extension Store {
    /// The store's `app_version` row.
    public func versionInfo() async throws -> StoreVersionInfo {
        let user = self.user
        return try await read { db in
            guard let info = try Bookkeeping.read(db) else {
                throw StoreError.storeDamaged(user: user, message: "the app_version table is missing")
            }
            return info
        }
    }
}
