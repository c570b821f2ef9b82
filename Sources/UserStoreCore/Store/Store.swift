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

    init(user: UserID, path: String, queue: DatabaseQueue) {
        self.user = user
        self.path = path
        self.queue = queue
    }

    /// Closes the connection after the work already queued on it.
    func close() {
        try? queue.close()
    }
}
