import GRDB

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
    /// The serial queue (GRDB's `DatabaseQueue`: one connection, one dispatch queue).
    public let queue: DatabaseQueue
    /// The connection's authorizer and deadline for client statements.
    public let guardian: StoreGuard
    /// Prepared client statements; use only on ``queue``.
    public let statements: StatementCache

    init(user: UserID, path: String, queue: DatabaseQueue, guardian: StoreGuard) {
        self.user = user
        self.path = path
        self.queue = queue
        self.guardian = guardian
        self.statements = StatementCache()
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
        return try await queue.read { db in
            guard let info = try Bookkeeping.read(db) else {
                throw StoreError.storeDamaged(user: user, message: "the app_version table is missing")
            }
            return info
        }
    }
}
