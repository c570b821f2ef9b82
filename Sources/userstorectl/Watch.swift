import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Follow a user's committed changes as they happen.",
            discussion: """
                Calls io.userstore.Store.Watch (docs/watch.md) and prints each reply as one JSON \
                line: {"ready": true, "position": P} once the watch is in place, then one line per \
                committed transaction ({"position", "committedAt", "changes"}) or {"position", \
                "reset": true}. Runs until interrupted. With --since, the transactions after that \
                position come first; a position older than the store keeps exits 1 (PositionLost, \
                naming the oldest position kept).
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Option(help: "Resume after this position (from an earlier watch).")
        var since: Int64?

        @Option(help: "Only these tables (comma-separated).")
        var tables: String?

        @Flag(help: "Each inserted or updated row's new values too.")
        var values = false

        func validate() throws {
            if let since, since < 0 { throw ValidationError("--since is a position: 0 or more") }
        }

        func run() async throws {
            var parameters: [String: JSONValue] = ["user": .string(user), "values": .bool(values)]
            if let since { parameters["since"] = .integer(since) }
            if let tables { parameters["tables"] = .array(commaSeparated(tables).map { .string($0) }) }
            let client = try await connection.client()
            client.interruptOnSignal()
            try await client.stream(.watch, parameters) { reply in
                // One write per line, not Output.jsonLine's print (which a pipe buffers): whoever
                // reads a watch sees each change as it commits.
                FileHandle.standardOutput.write(Data((JSONValue.object(reply).serialized + "\n").utf8))
            }
        }
    }
}
