import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Query: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run one read-only statement on many stores; rows come with the user ID first.",
            discussion: """
                Runs SQL on every store (--all), the stores in a state (--state), the stores the \
                release's current step reaches (--cohort), or the users given (--users), a few at a \
                time (--parallel), each within --timeout. Read-only is enforced by SQLite: a statement \
                that writes fails on every store, nothing changes. Stores are read as they are (not \
                migrated first). A table on a terminal (a new header when a store's columns differ); \
                --csv: a header line whose first column is user, then a line per row; --json: a line \
                {"user": ID, "row": {column: value}} per row and a final {"summary": true, ...}. The \
                stores that failed are listed at the end (exit 1 if any did). Each ARG binds a ? \
                parameter as in `sql`.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Flag(help: "Every store.")
        var all = false

        @Flag(help: "The stores the current step of the release reaches.")
        var cohort = false

        @Option(help: "Only stores in this state: current, pending, failed, too-new.")
        var state: String?

        @Option(help: "These users (comma-separated).")
        var users: String?

        @Option(help: "Stores queried at once (default 8).")
        var parallel: Int?

        @Option(help: "Time limit per store in milliseconds (default: limits.statementTimeoutMilliseconds).")
        var timeout: Int?

        @Flag(help: "CSV: a header line (user, then the columns), a line per row.")
        var csv = false

        @Argument(help: "One read-only SQL statement.")
        var sql: String

        @Argument(help: "Values for the statement's ? parameters.")
        var arguments: [String] = []

        func validate() throws {
            if users != nil && (all || cohort || state != nil) { throw ValidationError("--users cannot be combined with --all, --cohort or --state") }
            if users == nil && !all && !cohort && state == nil { throw ValidationError("give --all, --cohort, --state or --users") }
            if let parallel, !(1...64).contains(parallel) { throw ValidationError("--parallel must be between 1 and 64") }
            if let timeout, timeout < 1 { throw ValidationError("--timeout must be at least 1 ms") }
            if csv && connection.output.json { throw ValidationError("--csv and --json cannot be combined") }
        }

        func run() async throws {
            var call: [String: JSONValue] = ["sql": .string(sql)]
            let parameters = try SQLArguments.values(arguments)
            if !parameters.isEmpty { call["parameters"] = .array(parameters) }
            if let users { call["users"] = .array(commaSeparated(users).map { .string($0) }) }
            if all { call["all"] = true }
            if cohort { call["cohort"] = true }
            if let state { call["state"] = .string(state) }
            if let parallel { call["parallel"] = .integer(Int64(parallel)) }
            if let timeout { call["timeoutMilliseconds"] = .integer(Int64(timeout)) }
            let output = connection.output
            let client = try await connection.client()
            client.interruptOnSignal()
            var printer = RowPrinter(output: output, csv: csv)
            var failed: [(String, String)] = []
            var summary: [String: JSONValue] = [:]
            let progress = isatty(STDERR_FILENO) == 1 && !output.json
            try await client.stream(.queryStores, call) { reply in
                guard let user = reply["user"]?.stringValue else { summary = reply; return }
                if let error = reply["error"]?.stringValue {
                    failed.append((user, "\(reply["errorName"]?.stringValue ?? ""): \(error)"))
                } else {
                    printer.print(user: user, columns: (reply["columns"]?.arrayValue ?? []).map { Output.cell($0) }, rows: reply["rows"]?.arrayValue ?? [])
                }
                if progress {
                    FileHandle.standardError.write(Data("\r\u{1B}[K\(Output.cell(reply["done"]))/\(Output.cell(reply["total"])) stores, \(failed.count) failed".utf8))
                }
            }
            if progress { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
            if output.json {
                output.jsonLine(.object([
                    "summary": true, "stores": summary["total"] ?? 0, "rows": summary["rows"] ?? 0, "failures": .integer(Int64(failed.count)),
                    "failed": .array(failed.map { .object(["user": .string($0.0), "error": .string($0.1)]) }),
                ]))
            } else {
                if !csv { print("(\(Output.cell(summary["rows"])) rows from \(Output.cell(summary["total"])) stores)") }
                if !failed.isEmpty {
                    Output.error("\(failed.count) store\(failed.count == 1 ? "" : "s") failed:")
                    for (user, reason) in failed { Output.error("  \(user): \(reason)") }
                }
            }
            if !failed.isEmpty { throw ExitCode(CtlExitCode.someFailed.rawValue) }
        }
    }
}

/// Prints a fan-out query's rows as they arrive: JSON lines, CSV, or `|`-separated lines with
/// a header whenever the columns change.
struct RowPrinter {
    let output: Output
    let csv: Bool
    private var header: [String]?

    init(output: Output, csv: Bool) {
        self.output = output
        self.csv = csv
    }

    mutating func print(user: String, columns: [String], rows: [JSONValue]) {
        if output.json {
            for row in rows {
                let values = row.arrayValue ?? []
                var object: [String: JSONValue] = [:]
                for (index, column) in columns.enumerated() where index < values.count { object[column] = values[index] }
                output.jsonLine(.object(["user": .string(user), "row": .object(object)]))
            }
            return
        }
        if header != columns && (!csv || header == nil) {
            header = columns
            Swift.print(line(["user"] + columns))
        }
        for row in rows { Swift.print(line([user] + (row.arrayValue ?? []).map { cell($0) })) }
    }

    private func cell(_ value: JSONValue) -> String {
        if csv, case .null = value { return "" }
        return Output.cell(value)
    }

    private func line(_ cells: [String]) -> String {
        guard csv else { return cells.joined(separator: " | ") }
        return cells.map { cell in
            cell.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" })
                ? "\"" + cell.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : cell
        }.joined(separator: ",")
    }
}
