import Foundation
import UserStoreCore
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin.QueryStores`: one read-only statement on many stores (operators' fan-out,
/// docs/releases.md), streamed a store at a time with its user ID. Read-only is SQLite's
/// (`PRAGMA query_only` for the statement, through GRDB's read), not a parse of the SQL.
struct FleetQueryMethods {
    let context: DaemonContext

    func handle(_ request: Request, _ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        guard more else { throw VarlinkError.expectedMore() }
        let users = try await targets(parameters)
        let statement = try request.statement()
        let message = request.message
        let parallel = Int(try parameters.optionalInt("parallel") ?? Int64(min(8, context.configuration.fleetParallelism)))
        guard (1...64).contains(parallel) else { throw VarlinkError.invalidParameter("parallel") }
        var limits = context.limits
        if let timeout = try parameters.optionalInt("timeoutMilliseconds") {
            guard timeout >= 1 else { throw VarlinkError.invalidParameter("timeoutMilliseconds") }
            limits.statementTimeoutMilliseconds = Int(clamping: timeout)
        }
        let registry = context.registry, perStore = limits
        var done = 0, failures = 0, rows = 0
        try await FleetRunner.run(users, parallel: parallel, operation: { user -> Result<[UInt8], VarlinkError> in
            do {
                return .success(try await registry.fleet.closingAfter(user) {
                    try await registry.withExistingStore(user) { store in
                        try await store.read { db in
                            var writer = JSONWriter(capacity: 256)
                            let runner = SQLRunner(store: store, limits: perStore)
                            try message.withView { view throws(VarlinkError) in
                                try runner.run(db.sqliteConnection!, view, statement, output: .rows, into: &writer)
                            }
                            return writer.bytes
                        }
                    }
                })
            } catch {
                return .failure(Errors.from(error))
            }
        }, report: { user, outcome in
            done += 1
            var fields: [String: JSONValue]
            switch outcome {
            case .success(let bytes):
                fields = (try? JSONParser().parse(bytes))?.objectValue ?? [:]
                rows += fields["rows"]?.arrayValue?.count ?? 0
            case .failure(let error):
                failures += 1
                fields = ["error": .string(error.parameters["message"]?.stringValue ?? error.description), "errorName": .string(error.name)]
            }
            fields["user"] = .string(user.rawValue)
            fields["done"] = .integer(Int64(done))
            fields["total"] = .integer(Int64(users.count))
            try await send(VarlinkReply.encode(fields, continues: true))
        })
        try await send(VarlinkReply.encode(["done": .integer(Int64(done)), "total": .integer(Int64(users.count)),
                                            "failures": .integer(Int64(failures)), "rows": .integer(Int64(rows))]))
    }

    /// The stores asked for: `users`, or every known store with `all`, or the known stores in
    /// `state`, or the ones the release's current step reaches with `cohort` (the last three
    /// combine: `state` and `cohort` narrow `all`).
    private func targets(_ parameters: CallParameters) async throws -> [UserID] {
        let listed = try parameters.optionalStrings("users") ?? []
        let all = try parameters.optionalBool("all") ?? false
        let cohort = try parameters.optionalBool("cohort") ?? false
        let state = try parameters.optionalString("state").map { text throws(VarlinkError) -> FleetIndex.State in
            guard let state = FleetIndex.State(rawValue: text.replacingOccurrences(of: "-", with: "_")) else { throw .invalidParameter("state") }
            return state
        }
        if !listed.isEmpty {
            guard !all, !cohort, state == nil else { throw VarlinkError.invalidParameter("users") }
            var users: [UserID] = []
            for user in listed { users.append(try CallParameters.userID(user)) }
            return users
        }
        guard all || cohort || state != nil else { throw VarlinkError.invalidParameter("all") }
        let latest = context.registry.migrations.latestVersion
        let release = context.release.snapshot
        return await context.servedStores().compactMap { user, entry in
            if let state, FleetIndex.state(of: entry, latest: latest) != state { return nil }
            if cohort, !release.reaches(user) { return nil }
            return user
        }
    }
}
