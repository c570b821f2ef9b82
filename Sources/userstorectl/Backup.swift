import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Backup: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Take a consistent copy of a store (SQLite backup API), written by the daemon.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Option(help: "Where the daemon writes the copy (a new file it can write); default: the backups folder of the data directory.")
        var output: String?

        func run() async throws {
            var parameters: [String: JSONValue] = ["user": .string(user)]
            if let output {
                parameters["path"] = .string(output.hasPrefix("/") ? output : FileManager.default.currentDirectoryPath + "/" + output)
            }
            let result = try await connection.client().call(.backup, parameters)
            if connection.json { return connection.output.jsonLine(.object(result)) }
            print(Output.cell(result["path"]))
        }
    }
}
