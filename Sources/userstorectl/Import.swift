import ArgumentParser
import Foundation
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make existing SQLite files users' stores.",
            discussion: """
                userstorectl import USER FILE, or in bulk: userstorectl import --dir DIR \
                --pattern '{user}.db'. Each file is passed to the daemon as an open descriptor and \
                copied (never modified), checked, and given userstore's bookkeeping at \
                --schema-version (the last migration its schema already has; without it, the \
                file's userstore bookkeeping or a non-zero PRAGMA user_version decides). The \
                next request migrates each store from there. A user who has a store is refused \
                unless --replace (the old store is copied first). Checkpoint a file in WAL mode \
                first (sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)'): only the main file is read.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID (with FILE).")
        var user: String?

        @Argument(help: "The SQLite file.")
        var file: String?

        @Option(help: "Import every file of this folder that --pattern matches.")
        var dir: String?

        @Option(help: "File names in --dir, with {user} where the user ID is.")
        var pattern = "{user}.db"

        @Option(help: "The schema version the files are at.")
        var schemaVersion: Int64?

        @Flag(help: "Replace existing stores (each is copied first).")
        var replace = false

        func validate() throws {
            guard (user != nil && file != nil) != (dir != nil) else { throw ValidationError("give USER FILE, or --dir DIR [--pattern '{user}.db']") }
        }

        func run() async throws {
            let importer = FileImport(client: try await connection.client(), schemaVersion: schemaVersion, replace: replace)
            guard let dir else {
                let result = try await importer.run(user: user!, file: file!)
                if connection.json { return connection.output.jsonLine(.object(result)) }
                return print("imported \(file!) as the store of '\(user!)' at schema version \(Output.cell(result["schemaVersion"]))"
                             + (result["backup"].map { "; the previous store is kept as \(Output.cell($0))" } ?? ""))
            }
            let files = try FileImport.matches(in: dir, pattern: pattern)
            var imported = 0
            var failed: [JSONValue] = []
            for (index, match) in files.enumerated() {
                var outcome: [String: JSONValue] = ["user": .string(match.user), "file": .string(match.file)]
                do {
                    let result = try await importer.run(user: match.user, file: match.file)
                    outcome["state"] = "imported"
                    outcome["schemaVersion"] = result["schemaVersion"]
                    imported += 1
                } catch {
                    outcome["state"] = "failed"
                    outcome["error"] = .string(error.message)
                    failed.append(.object(outcome))
                    if error.exitCode == .unreachable { throw error }
                }
                if connection.json {
                    connection.output.jsonLine(.object(outcome))
                } else {
                    let state = outcome["state"] == "imported" ? connection.output.paint("imported", .green) : connection.output.paint("failed", .red)
                    print("[\(index + 1)/\(files.count)] \(match.user): \(state)" + (outcome["error"].map { " — \(Output.cell($0))" } ?? ""))
                }
            }
            let summary: [String: JSONValue] = ["summary": true, "total": .integer(Int64(files.count)), "imported": .integer(Int64(imported)),
                                                "failures": .integer(Int64(failed.count)), "failed": .array(failed)]
            if connection.json { connection.output.jsonLine(.object(summary)) } else { print("\(imported) of \(files.count) files imported, \(failed.count) failed") }
            if !failed.isEmpty { throw ExitCode(CtlExitCode.someFailed.rawValue) }
        }
    }
}
