import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct SQL: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "sql",
            abstract: "Run SQL on a store and print the results as tables.",
            discussion: """
                With a statement: runs it as an administrator (works on a store whose migration \
                failed, so its data can be repaired before a retry; the daemon's bookkeeping stays \
                protected). Each ARG binds a ? parameter: JSON scalars (42, 2.5, null, true, \
                "quoted") keep their type; anything else is text; an integer outside the signed 64-bit \
                range is refused. Negative numbers go after -- (sql USER 'SELECT ?' -- -5).

                Without one: on a terminal, a prompt with line editing and history \
                (~/.userstorectl_history); otherwise the statements of standard input, stopping at \
                the first that fails. Statements end with ';', and several on a line run in order; \
                sqlite3's .tables, .schema [TABLE] and .help work too. BEGIN [DEFERRED], COMMIT (END) and \
                ROLLBACK open and end an interactive transaction (io.userstore.Store.Begin, Commit and \
                Rollback); statements in it run in it, and the prompt shows '*'. \\q quits.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Argument(help: "One SQL statement (none: a prompt, or the statements of standard input).")
        var sql: String?

        @Argument(help: "Values for the statement's ? parameters.")
        var arguments: [String] = []

        func run() async throws {
            guard let sql else {
                let shell = SQLShell(client: try await connection.client(), user: user, output: connection.output, interactive: isatty(STDIN_FILENO) == 1)
                if !(await shell.run()) { throw ExitCode(CtlExitCode.someFailed.rawValue) }
                return
            }
            let parameters = try SQLArguments.values(arguments)
            var call: [String: JSONValue] = ["user": .string(user), "sql": .string(sql)]
            if !parameters.isEmpty { call["parameters"] = .array(parameters) }
            let result = try await connection.client().call(.adminExecute, call)
            let output = connection.output
            if output.json { return output.jsonLine(.object(result)) }
            if let columns = result["columns"]?.arrayValue {
                let rows = (result["rows"]?.arrayValue ?? []).map { row in (row.arrayValue ?? []).map { Output.cell($0) } }
                output.table(columns.map { Output.cell($0) }, rows)
                print("(\(rows.count) row\(rows.count == 1 ? "" : "s"))")
            } else {
                print("\(Output.cell(result["changes"])) row\(result["changes"] == 1 ? "" : "s") changed")
            }
        }
    }
}
