import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Rollback: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Roll a store back to a schema version with the migrations' Down sections.",
            discussion: "While the daemon still knows the newer migrations, the next request migrates the store forward again: roll back after removing or fixing them and reloading.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Option(name: .customLong("to"), help: "The schema version to roll back to.")
        var version: Int

        func validate() throws {
            if version < 0 { throw ValidationError("--to must be a schema version, 0 or more (0 undoes every migration)") }
        }

        func run() async throws {
            let result = try await connection.client().call(.rollbackMigrations, ["user": .string(user), "toVersion": .integer(Int64(version))])
            if connection.json { return connection.output.jsonLine(.object(result)) }
            let undone = result["undone"]?.arrayValue?.map { Output.cell($0) } ?? []
            print("\(user): rolled back \(undone.isEmpty ? "nothing" : undone.joined(separator: ", ")); now at version \(Output.cell(result["schemaVersion"]))")
        }
    }
}
