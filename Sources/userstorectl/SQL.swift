import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct SQL: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "sql",
            abstract: "Run one SQL statement on a store and print the result as a table.",
            discussion: """
                Runs as an administrator: works on a store whose migration failed, so its data can be \
                repaired before a retry (the daemon's bookkeeping stays protected). Each ARG binds a \
                ? parameter: JSON scalars (42, 2.5, null, true, "quoted") keep their type; anything \
                else is text.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Argument(help: "One SQL statement.")
        var sql: String

        @Argument(help: "Values for the statement's ? parameters.")
        var arguments: [String] = []

        func run() throws {
            let parameters: [JSONValue] = arguments.map { argument in
                if let value = try? JSONParser().parse(argument), value.arrayValue == nil, value.objectValue == nil { return value }
                return .string(argument)
            }
            var call: [String: JSONValue] = ["user": .string(user), "sql": .string(sql)]
            if !parameters.isEmpty { call["parameters"] = .array(parameters) }
            let result = try connection.client().call("io.userstore.Admin.Execute", call)
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
