import GRDBSQLite
import UserStoreCore
import UserStoreInterface
import UserStoreServer
import Varlink

/// What the fuzzer checks on call decoding (`Fuzz/`, scripts/fuzz.sh); the tests replay the
/// seed corpus through the same function: a message read as the request path reads it — the
/// transaction check, the call, user, statements and a Batch's statements — with its parameters
/// bound to a statement of as many placeholders. Hostile input gets errors, never a crash.
package enum ServerFuzzing {
    /// Every fuzz target by name: what the fuzzer executable feeds (`USERSTORE_FUZZ_TARGET`) and
    /// what `FuzzCorpusTests` replays `Fuzz/corpus/<name>/` through.
    package static let targets: [String: @Sendable (UnsafeBufferPointer<UInt8>) -> Void] = [
        "json": VarlinkFuzzing.json, "framing": VarlinkFuzzing.framing, "call": call,
        "migration": CoreFuzzing.migrationFile, "sql": CoreFuzzing.sql,
    ]

    /// A scratch in-memory database for binding (fuzzing is single-threaded).
    nonisolated(unsafe) private static var database: OpaquePointer? = {
        var connection: OpaquePointer?
        sqlite3_open_v2(":memory:", &connection, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil)
        return connection
    }()

    package static func call(_ data: UnsafeBufferPointer<UInt8>) {
        var tape = JSONTape(maxDepth: 64)
        guard (try? tape.parse(data)) != nil else { return }
        tape.withView(data) { view in
            _ = Method.of(view).flatMap { InteractiveTransaction.Call($0, view) }
            // What the router's task gets: the call read in place (refused by name when it is not one).
            _ = try? Request(JSONMessage(bytes: Array(data), parsed: tape), method: Method.of(view), descriptors: PassedDescriptors([]))
            guard view.kind(0) == .object else { return }
            let call = view.member("parameters", of: 0).flatMap { view.kind($0) == .object ? $0 : nil }
            if let call, let user = view.member("user", of: call), view.kind(user) == .string { _ = try? UserID(view.string(user)) }
            if let statement = try? SQLRunner.Statement.single(view, call) { bind(view, statement) }
            if let call, let statements = try? SQLRunner.Statement.batch(view, view.member("statements", of: call), maximum: 64) {
                for statement in statements { bind(view, statement) }
            }
        }
    }

    private static func bind(_ view: JSONView, _ statement: SQLRunner.Statement) {
        _ = view.withStringBytes(statement.sql) { $0.count }
        var sql = "SELECT ?"
        if let parameters = statement.parameters {
            switch view.kind(parameters) {
            case .array:
                sql = "SELECT " + Array(repeating: "?", count: max(1, min(view.count(parameters), 32))).joined(separator: ", ")
            case .object:
                var names: [String] = []
                view.forEachMember(of: parameters) { name, _ in
                    let text = view.string(name)
                    if names.count < 32, let first = text.first, first.isLetter || first == "_",
                       text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }) { names.append(":" + text) }
                }
                if !names.isEmpty { sql = "SELECT " + names.joined(separator: ", ") }
            default:
                break
            }
        }
        var prepared: OpaquePointer?
        guard sqlite3_prepare_v2(database, sql, -1, &prepared, nil) == SQLITE_OK, let prepared else { return }
        defer { sqlite3_finalize(prepared) }
        _ = try? ValueBinding.bind(view, statement.parameters, to: prepared)
    }
}
