import UserStoreInterface
import Varlink

/// One user's store on the daemon: its own SQLite file, behind its own serial queue. Calls for
/// one user run one at a time in the order they arrive; different users run in parallel.
///
/// Parameters are positional (`?`, `?1`, ...) and take Swift values and literals — `Int`,
/// `Int64`, `Double`, `String`, `Bool`, `Data`, `[UInt8]`, ``SQLValue`` and Optionals of them
/// (`nil` binds NULL) — bound exactly: an `Int64` stays a 64-bit integer, a `Double` a real.
///
/// Get one with ``UserStoreClient/store(for:)``; it is a cheap value, make as many as you like.
public struct UserStore: Sendable {
    /// The user ID (1-128 bytes of `A-Z a-z 0-9 . _ - @ +`).
    public let user: String
    let client: UserStoreClient
    private var calls: StatementCalls { StatementCalls(client: client, user: user, transaction: nil) }

    init(client: UserStoreClient, user: String) {
        self.client = client
        self.user = user
    }

    /// Opens the store (creating it and applying pending migrations if needed) and reports its
    /// versions. Any other call does the same implicitly.
    public func open() async throws -> StoreInfo {
        var message = CallMessage(method: Method.open.rawValue)
        message.field("user", user)
        return try Replies.info(try await client.call(message.finish(), readOnly: true))
    }

    /// Runs one statement and returns how many rows it changed and the last inserted rowid.
    /// With `durable` (the daemon replicates its stores: docs/replication.md), the reply comes
    /// once its transaction is in the replica; `ReplicationUnavailable` when that cannot be
    /// confirmed (the write is committed in the store all the same).
    @discardableResult
    public func execute(_ sql: String, _ parameters: (any SQLValueConvertible)?..., durable: Bool = false) async throws -> ExecuteResult {
        try await calls.execute(sql, Parameters.positional(parameters), durable: durable)
    }

    /// Runs one statement with named parameters (`"name"` binds `:name`, `@name`, `$name`).
    @discardableResult
    public func execute(_ sql: String, named parameters: [String: (any SQLValueConvertible)?], durable: Bool = false) async throws -> ExecuteResult {
        try await calls.execute(sql, Parameters.named(parameters), durable: durable)
    }

    /// Runs one statement and returns its rows.
    public func query(_ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> [Row] {
        try await calls.query(sql, Parameters.positional(parameters))
    }

    /// Runs one statement with named parameters and returns its rows.
    public func query(_ sql: String, named parameters: [String: (any SQLValueConvertible)?]) async throws -> [Row] {
        try await calls.query(sql, Parameters.named(parameters))
    }

    /// Runs one statement and decodes each row as `T`, by column name (see ``Row/decode(_:)``).
    public func query<T: Decodable>(_ type: T.Type, _ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> [T] {
        try await calls.query(type, sql, Parameters.positional(parameters))
    }

    /// Runs `statements` in order. `transaction` true (the default): in one transaction, and if
    /// one fails none of their effects remain; false: the statements before the failing one stay.
    /// A failure is a `SQLError` whose ``UserStoreError/statementIndex`` names the statement.
    /// `durable`: as for ``execute(_:_:durable:)``.
    @discardableResult
    public func batch(_ statements: [Statement], transaction: Bool = true, durable: Bool = false) async throws -> [StatementResult] {
        try await calls.batch(statements, transaction: transaction, durable: durable)
    }

    /// ``batch(_:transaction:durable:)`` with the statements as arguments.
    @discardableResult
    public func batch(_ statements: Statement..., transaction: Bool = true, durable: Bool = false) async throws -> [StatementResult] {
        try await calls.batch(statements, transaction: transaction, durable: durable)
    }

    /// Runs a read-only statement and returns its rows as they arrive (see ``RowSequence``):
    /// for results too large to hold at once.
    ///
    /// ```swift
    /// for try await row in try await alice.stream("SELECT id, body FROM notes") { … }
    /// ```
    public func stream(_ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> RowSequence {
        var message = CallMessage(method: Method.query.rawValue)
        message.field("user", user)
        message.statement(Statement(sql, Parameters.positional(parameters)))
        return RowSequence(producer: try await client.stream(message.finish(more: true), as: RowStreamDecoder.self))
    }

    /// Runs `body` in an interactive transaction and commits it when `body` returns; rolls it
    /// back when `body` throws or the task is cancelled (then rethrows).
    ///
    /// The transaction holds the user's store: that user's other calls wait until it ends (other
    /// users never wait), and the daemon rolls it back after `limits.transactionIdleMilliseconds`
    /// without a call (the next call gets `TransactionExpired`). It holds one of the pool's
    /// connections for itself. Use `tx`, not this store, inside `body`: a call outside the
    /// transaction for the same user would wait for it.
    ///
    /// - Parameters:
    ///   - mode: `.immediate` (the default) takes the write lock at once; `.deferred` when the
    ///     first write needs it.
    ///   - durable: the commit returns once it is in the replica (docs/replication.md), else
    ///     throws `ReplicationUnavailable` (committed in the store all the same).
    /// - Throws: what `body` threw; the commit's error (a commit that fails rolls back); or
    ///   ``UserStoreError/Kind/connectionClosed`` if the connection broke — then the daemon rolled
    ///   the transaction back, unless the break came after the commit was sent: that outcome is unknown.
    public func transaction<Result>(
        mode: TransactionMode = .immediate,
        durable: Bool = false,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (Transaction) async throws -> sending Result
    ) async throws -> sending Result {
        let pool = client.pool
        let lease = try await pool.acquire(exclusive: true)
        // Closed instead of given back when the transaction's state on it is unknown.
        var discard = false
        defer { pool.release(lease, discard: discard) }
        let id: String
        do {
            let reply = try await client.send(Method.begin.rawValue, ["user": user, "mode": mode.rawValue],
                                              on: lease, cancellable: true)
            guard let transaction = reply["transaction"]?.stringValue else {
                throw UserStoreError.protocolViolation("a Begin reply without transaction")
            }
            id = transaction
        } catch {
            // Cancelled while Begin waited for the store: it may still begin. Closing the
            // connection rolls back whatever it began; nobody else could end it.
            if error is CancellationError { discard = true }
            throw UserStoreClient.public(error)
        }
        let transaction = Transaction(calls: StatementCalls(client: client, user: user, transaction: (id, lease)))
        let result: Result
        do {
            result = try await body(transaction)
            try Task.checkCancellation()
        } catch {
            discard = await !rollBack(id, lease: lease)
            throw error
        }
        do {
            var message = CallMessage(method: Method.commit.rawValue)
            message.field("transaction", id)
            if durable { message.field("durable", true) }
            _ = try Replies.parameters(try await client.send(message.finish(), on: lease, cancellable: false))
        } catch {
            throw UserStoreClient.public(error)
        }
        return result
    }

    /// Rolls back, awaited whatever the task's state (nothing may be left open); false when
    /// even that failed: then the connection must be closed, which makes the daemon roll back.
    private func rollBack(_ id: String, lease: ConnectionPool.Lease) async -> Bool {
        do {
            _ = try await client.send(Method.rollback.rawValue, ["transaction": id], on: lease, cancellable: false)
            return true
        } catch let error as UserStoreError where error.kind == .daemon {
            return true // NoSuchTransaction / TransactionExpired: the daemon ended it already.
        } catch {
            return false
        }
    }
}

/// How an interactive transaction takes SQLite's write lock.
public enum TransactionMode: String, Sendable {
    /// `BEGIN IMMEDIATE`: at once (no SQLITE_BUSY half-way through).
    case immediate
    /// `BEGIN DEFERRED`: when the first write needs it.
    case deferred
}

/// An open interactive transaction (inside ``UserStore/transaction(mode:isolation:_:)``). Its
/// calls go on the transaction's own connection, in order.
public struct Transaction: Sendable {
    let calls: StatementCalls

    /// The daemon's id for it.
    public var id: String { calls.transaction!.id }
    /// The user whose store it holds.
    public var user: String { calls.user }

    /// ``UserStore/execute(_:_:)`` inside the transaction.
    @discardableResult
    public func execute(_ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> ExecuteResult {
        try await calls.execute(sql, Parameters.positional(parameters))
    }

    /// ``UserStore/query(_:_:)`` inside the transaction.
    public func query(_ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> [Row] {
        try await calls.query(sql, Parameters.positional(parameters))
    }

    /// ``UserStore/query(_:_:_:)`` inside the transaction.
    public func query<T: Decodable>(_ type: T.Type, _ sql: String, _ parameters: (any SQLValueConvertible)?...) async throws -> [T] {
        try await calls.query(type, sql, Parameters.positional(parameters))
    }

    /// Runs `statements` as one savepoint of the transaction: if one fails, the transaction is as
    /// it was before the batch (and stays open).
    @discardableResult
    public func batch(_ statements: [Statement]) async throws -> [StatementResult] {
        try await calls.batch(statements, transaction: true)
    }
}
