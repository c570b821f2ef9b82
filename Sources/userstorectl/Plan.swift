import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Plan: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the SQL that migrating a store would run and whether the store is copied first; nothing is executed.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        func run() async throws {
            let plan = try await connection.client().call(.plan, ["user": .string(user)])
            let output = connection.output
            if output.json { return output.jsonLine(.object(plan)) }
            let steps = plan["steps"]?.arrayValue ?? []
            let from = plan["fromVersion"]?.integerValue ?? 0, to = plan["toVersion"]?.integerValue ?? 0
            let reconcile = plan["reconcile"]?.arrayValue ?? []
            let schemaFile = plan["schemaFile"]?.stringValue
            if steps.isEmpty && schemaFile == nil { return print("-- store \(user) is at version \(from): nothing to do") }
            print("-- store \(user)\(plan["newStore"] == true ? " (new)" : ""): version \(from) -> \(to), \(steps.count) migration\(steps.count == 1 ? "" : "s")")
            for step in steps {
                print("")
                let skipped = step["skipped"] == true ? " (SQL skipped by app-version gating; recorded as applied)" : ""
                print("-- \(Output.cell(step["migration"])) (version \(Output.cell(step["version"])))\(skipped)")
                if let loss = step["dataLoss"]?.stringValue { print("-- can lose data: \(loss)") }
                for sql in step["sql"]?.arrayValue ?? [] { print(sql.stringValue ?? "") }
            }
            if let schemaFile {
                print("")
                print(reconcile.isEmpty ? "-- \(schemaFile): the store already matches (its hash is recorded)" : "-- reconcile with \(schemaFile)")
                for sql in reconcile { print(sql.stringValue ?? "") }
            }
            if let copy = plan["backup"]?.boolValue {
                print("")
                print("-- backup: \(copy ? "the store is copied first" : "no copy"): \(plan["backupReason"]?.stringValue ?? "")")
            }
        }
    }
}
