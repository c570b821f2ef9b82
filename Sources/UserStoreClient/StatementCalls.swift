import Varlink

/// The statement calls (Query, Execute, Batch) of one user's store, outside or inside a
/// transaction: what ``UserStore`` and ``Transaction`` share.
struct StatementCalls: Sendable {
    let client: UserStoreClient
    let user: String
    /// The interactive transaction and the connection it belongs to.
    let transaction: (id: String, lease: ConnectionPool.Lease)?

    func run(_ member: String, _ fields: [String: JSONValue], readOnly: Bool = false) async throws -> [String: JSONValue] {
        var fields = fields
        fields["user"] = .string(user)
        if let transaction {
            fields["transaction"] = .string(transaction.id)
            do {
                return try await client.send("io.userstore.Store." + member, fields, on: transaction.lease, cancellable: true)
            } catch {
                throw UserStoreClient.public(error)
            }
        }
        return try await client.call("io.userstore.Store." + member, fields, readOnly: readOnly)
    }

    func execute(_ sql: String, _ parameters: Parameters) async throws -> ExecuteResult {
        try ExecuteResult(try await run("Execute", Statement(sql, parameters).fields))
    }

    func query(_ sql: String, _ parameters: Parameters) async throws -> [Row] {
        try Replies.rows(try await run("Query", Statement(sql, parameters).fields))
    }

    func query<T: Decodable>(_ type: T.Type, _ sql: String, _ parameters: Parameters) async throws -> [T] {
        try await query(sql, parameters).map { try $0.decode(type) }
    }

    func batch(_ statements: [Statement], transaction mode: Bool) async throws -> [StatementResult] {
        var fields: [String: JSONValue] = ["statements": .array(statements.map { .object($0.fields) })]
        // Inside an interactive transaction the daemon takes the id from `transaction` itself.
        if transaction == nil { fields["transaction"] = .bool(mode) }
        return try Replies.batch(try await run("Batch", fields))
    }
}
