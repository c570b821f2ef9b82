import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct AcceptChecksums: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "accept-checksums",
            abstract: "Accept edited migration files: record their current checksums in a store.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Option(name: .customLong("version"), help: "Only this migration version (repeatable); default: every changed one.")
        var versions: [Int] = []

        func run() async throws {
            var parameters: [String: JSONValue] = ["user": .string(user)]
            if !versions.isEmpty { parameters["versions"] = .array(versions.map { .integer(Int64($0)) }) }
            let result = try await connection.client().call(.acceptChecksums, parameters)
            if connection.json { return connection.output.jsonLine(.object(result)) }
            let accepted = result["accepted"]?.arrayValue?.map { Output.cell($0) } ?? []
            print(accepted.isEmpty ? "\(user): no changed migration" : "\(user): accepted \(accepted.joined(separator: ", "))")
        }
    }
}
