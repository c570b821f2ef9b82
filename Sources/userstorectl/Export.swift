import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Export a consistent copy of a user's store.",
            discussion: """
                --format sqlite (the default) writes the database file, which opens with any \
                SQLite; --format json writes one JSON object per line: {"table", "columns", \
                "rows"} (a large table in several lines), values as in io.userstore.Store.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Option(help: "sqlite or json.")
        var format = "sqlite"

        @Option(name: [.short, .customLong("output")], help: "The file to write (written whole or not at all); default: standard output.")
        var output: String?

        func validate() throws {
            guard format == "sqlite" || format == "json" else { throw ValidationError("--format is sqlite or json") }
            if format == "sqlite", output == nil, isatty(STDOUT_FILENO) == 1 {
                throw ValidationError("refusing to write a database file to a terminal: pass -o FILE or redirect standard output")
            }
        }

        func run() async throws {
            let temporary = output.map { $0 + ".partial" }
            if let temporary { _ = FileManager.default.createFile(atPath: temporary, contents: nil, attributes: [.posixPermissions: 0o600]) }
            guard let sink = temporary.map({ FileHandle(forWritingAtPath: $0) }) ?? FileHandle.standardOutput else {
                throw CtlError(.someFailed, "userstorectl: cannot write \(output ?? "")")
            }
            do {
                let client = try await connection.client()
                client.interruptOnSignal()
                try await client.stream(.exportStore, ["user": .string(user), "format": .string(format)]) { reply in
                    if let chunk = reply["chunk"]?.stringValue {
                        guard let bytes = Data(base64Encoded: chunk) else { throw CtlError(.someFailed, "userstorectl: the daemon sent a chunk that is not base64") }
                        try sink.write(contentsOf: bytes)
                    } else if reply["table"] != nil {
                        try sink.write(contentsOf: Data((JSONValue.object(reply).serialized + "\n").utf8))
                    }
                }
                if let temporary, let output {
                    try sink.synchronize()
                    try sink.close()
                    guard rename(temporary, output) == 0 else { throw CtlError(.someFailed, "userstorectl: cannot write \(output): \(String(cString: strerror(errno)))") }
                }
            } catch {
                if let temporary { unlink(temporary) }
                throw error
            }
        }
    }
}
