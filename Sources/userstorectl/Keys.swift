import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Keys: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Per-user encryption keys (docs/encryption.md).",
            subcommands: [Rotate.self])

        struct Rotate: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Re-encrypt a store under a new data key (RotateStoreKey); copies made before (backups, the replica's history) can no longer be read.",
                discussion: """
                    The store is closed while it is rewritten (its requests wait). The new key is \
                    stored beside the old one first, the store rewritten page by page, then the old \
                    key dropped: a crash in between loses nothing. A plaintext store is encrypted. \
                    Errors: NoSuchStore, StoreKeyMissing, StoreErased, InvalidRequest (encryption is off).
                    """)

            @OptionGroup var connection: ConnectionOptions

            @Argument(help: "The user ID.")
            var user: String

            func run() throws {
                let result = try connection.client().call("io.userstore.Admin.RotateStoreKey", ["user": .string(user)])
                if connection.json { return connection.output.jsonLine(.object(result)) }
                print("\(Output.cell(result["user"])): \(Output.cell(result["pages"])) pages re-encrypted under a new key")
            }
        }
    }
}
