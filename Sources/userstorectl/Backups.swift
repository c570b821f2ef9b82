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
            discussion: "BACKUP is a file name or path from `userstorectl backups USER`. The next request migrates the restored store as usual.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        @Argument(help: "The backup: its file name or path.")
        var backup: String

        func run() throws {
            let result = try connection.client().call("io.userstore.Admin.RestoreStore", ["user": .string(user), "backup": .string(backup)])
            if connection.json { return connection.output.jsonLine(.object(result)) }
            print("restored the store of '\(user)' from \(Output.cell(result["backup"]?["path"])) (schema version \(Output.cell(result["schemaVersion"])))")
            if let previous = result["previous"]?.stringValue { print("the previous store is kept as \(previous)") }
        }
    }
}
