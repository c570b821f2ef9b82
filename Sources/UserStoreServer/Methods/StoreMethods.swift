import GRDB
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import UserStoreReplication
import Varlink

/// `io.userstore.Store`: Open, Query, Execute, Batch, Watch.
struct StoreMethods {
    let context: DaemonContext

    func handle(_ method: Method, _ request: Request, peer: PeerIdentity, send: ReplySink) async throws {
        let parameters = request.parameters
        switch method {
        case .open: try await send(open(request, try user(parameters, peer: peer)))
        case .query where request.more: try await streamedQuery(request, parameters, peer: peer, send: send)
        case .query: try await send(statement(request, parameters, peer: peer, output: .rows))
        case .execute: try await send(statement(request, parameters, peer: peer, output: .changes))
        case .batch: try await send(batch(request, parameters, peer: peer))
        case .watch:
            guard request.more else { throw VarlinkError.expectedMore() }
            let tables = try parameters.optionalStrings("tables").map { Set($0.map { $0.lowercased() }) }
            let since = try parameters.optionalInt("since")
            if let since, since < 0 { throw VarlinkError.invalidRequest("since must be a position (0 or more)") }
            try await StoreWatch(context: context, user: try user(parameters, peer: peer), tables: tables, since: since,
                                 values: try parameters.optionalBool("values") ?? false,
                                 maxBufferedBytes: context.limits.watchMaxBufferedBytes).run(send: send)
        default: throw VarlinkError.methodNotFound(request.name)
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

    /// Open: the store opened (created, restored, migrated) if need be, then its app-version
    /// row, read where ``StatementDispatch`` decides.
    private func open(_ request: Request, _ user: UserID) async throws -> [UInt8] {
        let limits = context.limits
        return try await context.registry.withStore(user, reporting: { store, report in
            await StatementDispatch(runner: SQLRunner(store: store, limits: limits), work: .open(report)).reply(request.message).bytes
        })
    }

    /// The reply to Open; `report` says what opening the store did (nil: it was open already).
    static func openReply(_ user: UserID, _ info: StoreVersionInfo, report: MigrationReport?) -> [UInt8] {
        VarlinkReply.encode([
            "user": .string(user.rawValue),
            "schemaVersion": .integer(info.schemaVersion),
            "appVersion": .string(info.appVersion),
            "createdByAppVersion": .string(info.createdByAppVersion),
            "created": .bool(report?.created ?? false),
            "migrated": .bool(report?.migrated ?? false),
            "appliedVersions": .array((report?.applied ?? []).map { .integer($0) }),
        ])
    }

    private func statement(_ request: Request, _ parameters: CallParameters, peer: PeerIdentity, output: SQLRunner.Output) async throws -> [UInt8] {
        let user = try user(parameters, peer: peer)
        let durable = try output == .changes && durable(request, user: user)
        return try await StatementDispatch.leasedReply(.statement(try request.statement(), output), of: request.message, for: user,
                                                       durable: durable, context: context)
    }

    /// Whether this write call waits for the replica (DurableWrites).
    private func durable(_ request: Request, user: UserID) throws(VarlinkError) -> Bool {
        try request.message.withView { view throws(VarlinkError) in
            try context.isDurable(view, view.member("parameters", of: 0), user: user.rawValue)
        }
    }

    /// A Query with `more`: its rows in several replies, stepped as the client reads them.
    private func streamedQuery(_ request: Request, _ parameters: CallParameters, peer: PeerIdentity, send: ReplySink) async throws {
        let user = try user(parameters, peer: peer)
        let statement = try request.statement()
        let limits = context.limits
        try await context.registry.withStore(user) { store in
            try await StreamedQuery(store: store, limits: limits).run(request.message, statement, send: send)
        }
    }

    private func batch(_ request: Request, _ parameters: CallParameters, peer: PeerIdentity) async throws -> [UInt8] {
        let user = try user(parameters, peer: peer)
        let statements = try request.batchStatements(maximum: context.limits.maxBatchStatements)
        let transaction = try parameters.optionalBool("transaction") ?? true
        return try await StatementDispatch.leasedReply(.batch(statements, transaction ? .transaction : .statements), of: request.message, for: user,
                                                       durable: try durable(request, user: user), context: context)
    }
}

/// Runs a Batch: in one IMMEDIATE transaction (rolled back if any statement fails) or
/// statement by statement — or, inside an interactive transaction, as one savepoint (a failing
/// Batch leaves the transaction as it was before it).
struct BatchRunner {
    let runner: SQLRunner

    enum Mode {
        /// Its own IMMEDIATE transaction.
        case transaction
        /// Statement by statement (autocommit).
        case statements
        /// A savepoint inside the interactive transaction that holds the store.
        case savepoint
    }

    /// The whole reply (results, or the error of the statement that failed).
    func reply(_ db: Database, message: JSONMessage, statements: [SQLRunner.Statement], mode: Mode) -> [UInt8] {
        do {
            return try message.withView { view in try run(db, view, statements: statements, mode: mode) }
        } catch let error as VarlinkError {
            return VarlinkReply.encode(error)
        } catch let error as DatabaseError {
            if error.resultCode == .SQLITE_CORRUPT || error.resultCode == .SQLITE_NOTADB { runner.store.markDamaged(error.message ?? "corrupt") }
            return VarlinkReply.encode(Errors.sqlite(error, user: runner.store.user.rawValue))
        } catch {
            return VarlinkReply.encode(Errors.from(error))
        }
    }

    private func run(_ db: Database, _ view: JSONView, statements: [SQLRunner.Statement], mode: Mode) throws -> [UInt8] {
        var writer = JSONWriter(capacity: 256 * max(statements.count, 1))
        let recorder = runner.store.recorder
        switch mode {
        case .transaction: try db.execute(sql: "BEGIN IMMEDIATE")
        case .savepoint:
            try db.execute(sql: "SAVEPOINT userstore_batch")
            recorder?.savepoint(.begin("userstore_batch"))
        case .statements: break
        }
        do {
            try VarlinkReply.encode(into: &writer) { (writer: inout JSONWriter) throws(VarlinkError) in
                writer.raw("{\"results\":[")
                for (offset, statement) in statements.enumerated() {
                    if offset > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                    try runner.run(db.sqliteConnection!, view, statement, output: .both, inTransaction: mode == .savepoint, into: &writer)
                }
                writer.raw("]}")
            }
            switch mode {
            case .transaction:
                do { try recorder?.flush(db.sqliteConnection!) } catch { throw Errors.changeLog(error) }
                try db.execute(sql: "COMMIT")
            case .savepoint:
                try db.execute(sql: "RELEASE userstore_batch")
                recorder?.savepoint(.release("userstore_batch"))
            case .statements: break
            }
        } catch {
            switch mode {
            case .transaction:
                if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
            case .savepoint:
                // SQLite may already have rolled the whole transaction back (an interrupt).
                if db.isInsideTransaction {
                    try? db.execute(sql: "ROLLBACK TO userstore_batch")
                    try? db.execute(sql: "RELEASE userstore_batch")
                    recorder?.savepoint(.rollback("userstore_batch"))
                    recorder?.savepoint(.release("userstore_batch"))
                }
            case .statements: break
            }
            throw error
        }
        return writer.bytes
    }
}
