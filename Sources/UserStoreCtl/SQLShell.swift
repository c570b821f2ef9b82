import CEditLine
import Foundation
import GRDBSQLite
import UserStoreCore
import UserStoreInterface
import Varlink

/// `userstorectl sql USER` without a statement: statements typed at a prompt (with line editing
/// and history on a terminal) or read from standard input, as `psql` and `sqlite3` do.
///
/// A statement ends with `;` (SQLite's own `sqlite3_complete` decides, so a `;` inside a string
/// or a trigger body does not end it); a line may hold several, run in order. sqlite3's
/// `.tables`, `.schema [TABLE]` and `.help` work at the start of a statement. `BEGIN`,
/// `COMMIT`/`END` and `ROLLBACK` open and end an interactive transaction through the API (`io.userstore.Store.Begin`, `Commit`, `Rollback`);
/// in one, statements run in it (and the prompt says `*`). Outside one, a statement runs as an
/// administrator (`io.userstore.Admin.Execute`), like `userstorectl sql USER "SQL"`.
public final class SQLShell {
    private let client: DaemonClient
    private let user: String
    private let output: Output
    private let interactive: Bool
    private var transaction: String?
    private static var historyPath: String { (ProcessInfo.processInfo.environment["HOME"] ?? "/root") + "/.userstorectl_history" }

    public init(client: DaemonClient, user: String, output: Output, interactive: Bool) {
        self.client = client
        self.user = user
        self.output = output
        self.interactive = interactive
    }

    /// Runs until end of input (or `\q`). Returns false when a statement failed (reading a
    /// script, the first failure stops it).
    public func run() async -> Bool {
        if interactive {
            _ = read_history(Self.historyPath)
            print("userstorectl sql: store '\(user)'. End statements with ';'. BEGIN/COMMIT/ROLLBACK for a transaction; .help for more; \\q to quit.")
        }
        defer {
            if interactive {
                stifle_history(1000)
                _ = write_history(Self.historyPath)
            }
        }
        var pending = ""
        var succeeded = true
        while let line = readLine(continuation: !pending.isEmpty) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if pending.isEmpty, trimmed == "\\q" || trimmed == ".quit" || trimmed == "exit" || trimmed == "quit" { break }
            if pending.isEmpty, trimmed.isEmpty { continue }
            if pending.isEmpty, trimmed.hasPrefix(".") {
                if interactive { add_history(trimmed) }
                if !(await dotCommand(trimmed)) {
                    succeeded = false
                    if !interactive { break }
                }
                continue
            }
            pending += (pending.isEmpty ? "" : "\n") + line
            guard sqlite3_complete(pending) != 0 else { continue }
            if interactive { add_history(pending) }
            // Several statements on a line (`SELECT 1; SELECT 2;`) run one after another.
            let statements = SQLScript(pending).statements
            pending = ""
            var allRan = true
            for statement in statements where !(await execute(statement)) {
                allRan = false
                break
            }
            if !allRan {
                succeeded = false
                if !interactive { break }
            }
        }
        if !pending.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty {
            Output.error("userstorectl: incomplete statement at the end of input (missing ';'): \(pending)")
            succeeded = false
        }
        if let transaction {
            Output.error("userstorectl: transaction \(transaction) was open at the end: rolled back")
            _ = try? await client.call(.rollback, ["transaction": .string(transaction)])
            succeeded = false
        }
        return succeeded
    }

    private func readLine(continuation: Bool) -> String? {
        guard interactive else { return Swift.readLine(strippingNewline: true) }
        let prompt = "\(user)\(transaction == nil ? "" : "*")\(continuation ? "-" : "=")> "
        guard let line = readline(prompt) else {
            print()
            return nil
        }
        defer { free(line) }
        return String(cString: line)
    }

    /// sqlite3's dot commands that make sense here: `.tables`, `.schema [TABLE]`, `.help`.
    /// False when it failed or is unknown (the error is printed).
    func dotCommand(_ line: String) async -> Bool {
        let words = line.split(whereSeparator: \.isWhitespace).map(String.init)
        do {
            switch words[0] {
            case ".tables":
                let rows = try await run("SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY name", [])
                printColumn(rows)
            case ".schema":
                let table = words.count > 1 ? words[1] : nil
                let rows = try await run("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
                                   + (table == nil ? "" : " AND tbl_name = ?") + " ORDER BY tbl_name, type DESC, name",
                                   table.map { [.string($0)] } ?? [])
                printColumn(rows, after: ";")
            case ".help":
                print("""
                    .tables            the tables and views
                    .schema [TABLE]    the CREATE statements (of TABLE and its indexes and triggers)
                    .help              this list
                    \\q (.quit)         quit
                    Statements end with ';' (several on a line run in order). BEGIN, COMMIT and ROLLBACK
                    open and end a transaction.
                    """)
            default:
                throw CtlError(.someFailed, "unknown command \(InputQuote.prefix(words[0])): .help lists the ones userstorectl knows")
            }
            return true
        } catch let error as CtlError {
            Output.error(error.message)
            return false
        } catch {
            Output.error("\(error)")
            return false
        }
    }

    /// A one-column result as sqlite3's dot commands print it: each value on its line (`after`
    /// appended); with --json, as any result.
    private func printColumn(_ result: [String: JSONValue], after suffix: String = "") {
        if output.json { return show(result) }
        for row in result["rows"]?.arrayValue ?? [] { print(Output.cell(row.arrayValue?.first) + suffix) }
    }

    /// Runs `sql` in the open transaction, or as an administrator outside one.
    private func run(_ sql: String, _ parameters: [JSONValue]) async throws -> [String: JSONValue] {
        if let transaction {
            var statement: [String: JSONValue] = ["sql": .string(sql)]
            if !parameters.isEmpty { statement["parameters"] = .array(parameters) }
            let batch = try await client.call(.batch, ["user": .string(user), "transaction": .string(transaction),
                                                                      "statements": [.object(statement)]])
            return batch["results"]?.arrayValue?.first?.objectValue ?? [:]
        }
        var call: [String: JSONValue] = ["user": .string(user), "sql": .string(sql)]
        if !parameters.isEmpty { call["parameters"] = .array(parameters) }
        return try await client.call(.adminExecute, call)
    }

    /// Runs one statement; false when it failed (the error is printed).
    func execute(_ statement: String) async -> Bool {
        do {
            switch Self.control(statement) {
            case .begin(let mode)?:
                guard transaction == nil else { throw CtlError(.someFailed, "a transaction is already open; COMMIT or ROLLBACK it first") }
                transaction = try await client.call(.begin, ["user": .string(user), "mode": .string(mode)])["transaction"]?.stringValue
                print("BEGIN")
            case .end(let commit)?:
                guard let open = transaction else { throw CtlError(.someFailed, "no transaction is open") }
                transaction = nil
                _ = try await client.call(commit ? Method.commit : Method.rollback, ["transaction": .string(open)])
                print(commit ? "COMMIT" : "ROLLBACK")
            case nil:
                show(try await run(statement, []))
            }
            return true
        } catch let error as CtlError {
            Output.error(error.message)
            if error.message.contains("TransactionExpired") || error.message.contains("NoSuchTransaction") { transaction = nil }
            return false
        } catch {
            Output.error("\(error)")
            return false
        }
    }

    private func show(_ result: [String: JSONValue]) {
        if output.json { return output.jsonLine(.object(result)) }
        if let columns = result["columns"]?.arrayValue {
            let rows = (result["rows"]?.arrayValue ?? []).map { row in (row.arrayValue ?? []).map { Output.cell($0) } }
            output.table(columns.map { Output.cell($0) }, rows)
            print("(\(rows.count) row\(rows.count == 1 ? "" : "s"))")
        } else {
            print("\(Output.cell(result["changes"])) row\(result["changes"] == 1 ? "" : "s") changed")
        }
    }

    enum Control: Equatable {
        case begin(mode: String)
        case end(commit: Bool)
    }

    /// Whether `statement` is transaction control, which the API does instead of SQL.
    /// `ROLLBACK TO` (a savepoint) is SQL and runs in the transaction.
    static func control(_ statement: String) -> Control? {
        let words = statement.uppercased().replacingOccurrences(of: ";", with: " ")
            .split(whereSeparator: { $0.isWhitespace }).map(String.init)
        guard let first = words.first else { return nil }
        let rest = Array(words.dropFirst())
        switch first {
        case "BEGIN":
            let mode = rest.first == "DEFERRED" ? "deferred" : "immediate"
            let allowed: Set<String> = ["DEFERRED", "IMMEDIATE", "TRANSACTION"]
            return rest.allSatisfy(allowed.contains) ? .begin(mode: mode) : nil
        case "COMMIT", "END":
            return rest.allSatisfy { $0 == "TRANSACTION" } ? .end(commit: true) : nil
        case "ROLLBACK":
            return rest.allSatisfy { $0 == "TRANSACTION" } ? .end(commit: false) : nil
        default:
            return nil
        }
    }
}
