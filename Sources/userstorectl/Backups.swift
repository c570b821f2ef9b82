import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Backups: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the backups of a user's store, oldest first.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        func run() throws {
            let backups = try connection.client().call("io.userstore.Admin.ListBackups", ["user": .string(user)])["backups"]?.arrayValue ?? []
            if connection.json { return backups.forEach { connection.output.jsonLine($0) } }
            connection.output.table(["TAKEN AT", "VERSION", "REASON", "BYTES", "FILE"], backups.map { backup in
                [Output.cell(backup["takenAt"]), Output.cell(backup["schemaVersion"]), Output.cell(backup["reason"]),
                 Output.cell(backup["bytes"]), String(Output.cell(backup["path"]).split(separator: "/").last ?? "")]
            })
        }
    }

    struct Restore: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace a user's store with one of its backups (the live store is copied first).",
            discussion: """
                BACKUP is a file name or path from `userstorectl backups USER`. With --from-replica instead, the store \
                comes back from the replication replica (docs/replication.md): its latest state, or its state at \
                --timestamp (RFC 3339). Either way the copy is integrity-checked first, the live store is kept as a \
                backup (reason before-restore), and the next request migrates the restored store as usual.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Argument(help: "The backup: its file name or path (not with --from-replica).")
        var backup: String?

        @Flag(help: "Restore from the replication replica instead of a local backup.")
        var fromReplica = false

        @Option(help: "With --from-replica: the point in time to restore (RFC 3339, e.g. 2026-11-23T18:00:00Z); default the latest.")
        var timestamp: String?

        func validate() throws {
            if fromReplica && backup != nil { throw ValidationError("give a BACKUP or --from-replica, not both") }
            if !fromReplica && backup == nil { throw ValidationError("missing BACKUP (or --from-replica)") }
            if timestamp != nil && !fromReplica { throw ValidationError("--timestamp needs --from-replica") }
        }

        func run() throws {
            if fromReplica { return try restoreFromReplica() }
            let backup = self.backup!
            let result = try connection.client().call("io.userstore.Admin.RestoreStore", ["user": .string(user), "backup": .string(backup)])
            if connection.json { return connection.output.jsonLine(.object(result)) }
            print("restored the store of '\(user)' from \(Output.cell(result["backup"]?["path"])) (schema version \(Output.cell(result["schemaVersion"])))")
            if let previous = result["previous"]?.stringValue { print("the previous store is kept as \(previous)") }
        }

        private func restoreFromReplica() throws {
            var parameters: [String: JSONValue] = ["user": .string(user)]
            if let timestamp { parameters["timestamp"] = .string(timestamp) }
            let result = try connection.client().call("io.userstore.Admin.RestoreFromReplica", parameters)
            if connection.json { return connection.output.jsonLine(.object(result)) }
            let milliseconds = Double(result["durationMicroseconds"]?.integerValue ?? 0) / 1000
            print("restored the store of '\(user)' from \(Output.cell(result["source"]))\(timestamp.map { " as of \($0)" } ?? "") "
                  + "(schema version \(Output.cell(result["schemaVersion"])), \(String(format: "%.1f", milliseconds)) ms)")
            if let previous = result["previous"]?.stringValue { print("the previous store is kept as \(previous)") }
        }
    }
}
