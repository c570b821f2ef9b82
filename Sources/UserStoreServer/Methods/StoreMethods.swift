import GRDB
import UserStoreCore
import Varlink

/// `io.userstore.Store`: Open, Query, Execute, Batch.
struct StoreMethods {
    let context: DaemonContext

    func handle(_ call: VarlinkCall, peer: PeerIdentity, send: ReplySink) async throws {
        let parameters = CallParameters(call)
        switch call.member {
        case "Open": try await send(open(try user(parameters, peer: peer)))
        case "Query": try await send(statement(parameters, peer: peer, output: .rows))
        case "Execute": try await send(statement(parameters, peer: peer, output: .changes))
        case "Batch": try await send(batch(parameters, peer: peer))
        default: throw VarlinkError.methodNotFound(call.method)
        }
    }

    /// The store this call addresses; with per-Unix-user stores, only the caller's own.
    func user(_ parameters: CallParameters, peer: PeerIdentity) throws(VarlinkError) -> UserID {
        if let only = peer.grant.onlyStore {
            let requested = try parameters.optionalString("user") ?? only
            guard requested == only else {
                throw Errors.permissionDenied("stores are per Unix user: uid \(peer.uid) may only reach store '\(only)'")
            }
            return try CallParameters.userID(only)
        }
        return try parameters.user()
    }

    private func open(_ user: UserID) async throws -> [UInt8] {
        let (info, report) = try await context.registry.withStore(user, reporting: { store, report in
            (try await store.versionInfo(), report)
        })
        return VarlinkReply.encode([
            "user": .string(user.rawValue),
            "schemaVersion": .integer(info.schemaVersion),
            "appVersion": .string(info.appVersion),
            "createdByAppVersion": .string(info.createdByAppVersion),
            "created": .bool(report?.created ?? false),
            "migrated": .bool(report?.migrated ?? false),
            "appliedVersions": .array((report?.applied ?? []).map { .integer($0) }),
        ])
    }

    private func statement(_ parameters: CallParameters, peer: PeerIdentity, output: SQLRunner.Output) async throws -> [UInt8] {
        try await SQLRunner.reply(context.registry, user: try user(parameters, peer: peer), access: .client, sql: try parameters.string("sql"),
                                  parameters: parameters.values["parameters"], output: output, limits: context.limits)
    }

    private func batch(_ parameters: CallParameters, peer: PeerIdentity) async throws -> [UInt8] {
        let user = try user(parameters, peer: peer)
        guard let list = parameters.values["statements"]?.arrayValue else { throw VarlinkError.invalidParameter("statements") }
        let limits = context.limits
        guard list.count <= limits.maxBatchStatements else {
            throw Errors.limitExceeded("batchStatements", maximum: limits.maxBatchStatements)
        }
        var statements: [(sql: String, parameters: JSONValue?)] = []
        for (offset, element) in list.enumerated() {
            guard let sql = element["sql"]?.stringValue else { throw VarlinkError.invalidParameter("statements[\(offset)].sql") }
            statements.append((sql, element["parameters"]))
        }
        let transaction = try parameters.optionalBool("transaction") ?? true
        let frozen = statements
        return try await context.registry.withStore(user) { store in
            try await store.write { db in
                try BatchRunner(runner: SQLRunner(store: store, limits: limits)).run(db, statements: frozen, transaction: transaction)
            }
        }
    }
}

/// Runs a Batch: in one IMMEDIATE transaction (rolled back if any statement fails) or
/// statement by statement.
struct BatchRunner {
    let runner: SQLRunner

    func run(_ db: Database, statements: [(sql: String, parameters: JSONValue?)], transaction: Bool) throws -> [UInt8] {
        var writer = JSONWriter(capacity: 256 * max(statements.count, 1))
        if transaction { try db.execute(sql: "BEGIN IMMEDIATE") }
        do {
            try VarlinkReply.encode(into: &writer) { writer in
                writer.raw("{\"results\":[")
                for (index, statement) in statements.enumerated() {
                    if index > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                    try runner.run(db.sqliteConnection!, sql: statement.sql, parameters: statement.parameters, output: .both, index: index, into: &writer)
                }
                writer.raw("]}")
            }
            if transaction { try db.execute(sql: "COMMIT") }
        } catch {
            if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
            if let error = error as? DatabaseError {
                throw Errors.sqlError(code: error.extendedResultCode.rawValue, message: error.message ?? "\(error.resultCode)")
            }
            throw error
        }
        return writer.bytes
    }
}
