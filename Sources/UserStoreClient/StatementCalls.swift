import UserStoreInterface
import Varlink

/// The statement calls (Query, Execute, Batch) of one user's store, outside or inside a
/// transaction: what ``UserStore`` and ``Transaction`` share.
struct StatementCalls: Sendable {
    let client: UserStoreClient
    let user: String
    /// The interactive transaction and the connection it belongs to.
    let transaction: (id: String, lease: ConnectionPool.Lease)?

    /// Calls `method` for this user (and transaction) with the fields
    /// `write` adds; returns the reply's bytes.
    func run(_ method: String, readOnly: Bool = false, _ write: (inout CallMessage) -> Void) async throws -> [UInt8] {
        var message = CallMessage(method: method)
        message.field("user", user)
        if let transaction { message.field("transaction", transaction.id) }
        write(&message)
        let bytes = message.finish()
        if let transaction {
            do {
                return try await client.send(bytes, on: transaction.lease, cancellable: true)
            } catch {
                throw UserStoreClient.public(error)
            }
        }
        return try await client.call(bytes, readOnly: readOnly)
    }

    func execute(_ sql: String, _ parameters: Parameters, durable: Bool = false) async throws -> ExecuteResult {
        try Replies.execute(try await run(Method.execute.rawValue) { message in
            message.statement(Statement(sql, parameters))
            if durable { message.field("durable", true) }
        })
    }

    func query(_ sql: String, _ parameters: Parameters) async throws -> [Row] {
        try Replies.rows(try await run(Method.query.rawValue) { $0.statement(Statement(sql, parameters)) })
    }

    func query<T: Decodable>(_ type: T.Type, _ sql: String, _ parameters: Parameters) async throws -> [T] {
        try await query(sql, parameters).map { try $0.decode(type) }
    }

    func batch(_ statements: [Statement], transaction mode: Bool, durable: Bool = false) async throws -> [StatementResult] {
        try Replies.batch(try await run(Method.batch.rawValue) { message in
            message.statements(statements)
            // Inside an interactive transaction the daemon takes the id from `transaction` itself.
            if transaction == nil { message.field("transaction", mode) }
            if durable { message.field("durable", true) }
        })
    }
}
