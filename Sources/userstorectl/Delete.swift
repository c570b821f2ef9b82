import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a user's store, its WAL and every backup of it (erasure).",
            discussion: """
                Waits for work in flight on the store, then removes its files; a later request \
                starts a new, empty store. On a terminal it asks for the user ID as confirmation; \
                elsewhere it refuses without --yes.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Flag(help: "Keep the store's backups.")
        var keepBackups = false

        @Flag(help: "Do not ask for confirmation.")
        var yes = false

        func run() async throws {
            if !yes {
                guard isatty(STDIN_FILENO) == 1 else {
                    throw CtlError(.usage, "userstorectl: refusing to delete the store of '\(user)' without confirmation: pass --yes")
                }
                print("Delete every file of the store of '\(user)'\(keepBackups ? "" : " and all its backups")? This cannot be undone.")
                print("Type the user ID to confirm: ", terminator: "")
                guard readLine() == user else { throw CtlError(.someFailed, "userstorectl: not deleted") }
            }
            let result = try await connection.client().call(.deleteStore, ["user": .string(user), "keepBackups": .bool(keepBackups)])
            if connection.json { return connection.output.jsonLine(.object(result)) }
            let removed = result["removedFiles"]?.arrayValue ?? []
            if result["existed"] == true {
                print("deleted the store of '\(user)': \(removed.count) file\(removed.count == 1 ? "" : "s") removed")
            } else {
                print("'\(user)' had no store\(removed.isEmpty ? "" : "; \(removed.count) backup file\(removed.count == 1 ? "" : "s") removed")")
            }
        }
    }
}
