import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Keys: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Per-user encryption keys (docs/encryption.md).",
            subcommands: [Rotate.self, Rewrap.self])

        struct Rotate: AsyncParsableCommand {
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

            func run() async throws {
                let result = try await connection.client().call(.rotateStoreKey, ["user": .string(user)])
                if connection.json { return connection.output.jsonLine(.object(result)) }
                print("\(Output.cell(result["user"])): \(Output.cell(result["pages"])) pages re-encrypted under a new key")
            }
        }
    }
}

extension UserStoreCtlCommand.Keys {
    /// `keys rewrap`: the key-encryption key's rotation, with the daemon stopped.
    struct Rewrap: AsyncParsableCommand, DaemonlessCommand {
        static let configuration = CommandConfiguration(
            abstract: "Rotate the key-encryption key: rewrap every user's data key under a new one (userstored stopped; no store is rewritten).",
            discussion: """
                Takes the data directory's lock (refuses while userstored runs). Reads the old key from \
                --key-file (default: the configuration's encryption.keyFile) and the new one from \
                --new-key-file (32 bytes, raw or base64), checks the old one against the key store, \
                marks the rotation begun (userstored refuses to start until it is finished: \
                KeyRotationUnderWay), rewraps each record with progress, and replaces the key store's \
                check record last. Interrupted, run it again with the same keys: records already \
                rewrapped are skipped. Then point encryption.keyFile (or the credential) at the new key. \
                Every daemon sharing the key store must be stopped: on a cluster's etcd key store the \
                command refuses while any host of the cluster is running (exit 3, naming them); for a \
                bucket several hosts share, stop them all first.
                """)

        @Option(help: "The daemon's configuration file (data directory, encryption.keyStore).")
        var config = "/etc/userstore/userstored.yaml"

        @Option(help: "The current key-encryption key (default: encryption.keyFile of the configuration).")
        var keyFile: String?

        @Option(help: "The new key-encryption key: 32 bytes, raw or base64 (head -c 32 /dev/urandom | base64).")
        var newKeyFile: String

        @Flag(help: "One JSON line at the end instead of text.")
        var json = false

        func run() async throws {
            let (keyring, newKey, lock) = try await KeyRotation.prepare(configurationPath: config, keyFile: keyFile, newKeyFile: newKeyFile)
            defer { _ = lock }
            var last = 0
            let rewrapped = try await KeyRotation.run(keyring, to: newKey) { done, total in
                if !json, done == total || done - last >= 1000 {
                    last = done
                    print("\(done)/\(total) records")
                }
            }
            if json {
                print("{\"rewrapped\": \(rewrapped)}")
            } else {
                print("\(rewrapped) data keys rewrapped; point encryption.keyFile (or encryption.credential) at the new key")
            }
        }
    }
}

extension UserStoreCtlCommand {
    /// `encrypt`: plaintext stores encrypted ahead of traffic.
    struct Encrypt: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Encrypt plaintext stores now (EncryptStores), instead of on their next open (docs/encryption.md).",
            discussion: "Progress per store; exit 1 when any store could not be encrypted (each listed with its error).")

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var selection: FleetSelection

        func run() async throws {
            var parameters: [String: JSONValue] = [:]
            if selection.all { parameters["all"] = true } else { parameters["users"] = .array(selection.users.map { .string($0) }) }
            let client = try await connection.client()
            var summary: [String: JSONValue] = [:]
            try await client.stream(.encryptStores, parameters) { reply in
                if connection.json { return connection.output.jsonLine(.object(reply)) }
                if let user = reply["user"] {
                    let outcome = reply["ok"] == .bool(true) ? "encrypted" : "\(Output.cell(reply["error"])): \(Output.cell(reply["message"]))"
                    print("[\(Output.cell(reply["done"]))/\(Output.cell(reply["total"]))] \(Output.cell(user)): \(outcome)")
                } else {
                    summary = reply
                }
            }
            if !connection.json { print("\(Output.cell(summary["migrated"])) stores encrypted, \(Output.cell(summary["failures"])) failed") }
            if (summary["failures"]?.integerValue ?? 0) > 0 { throw ExitCode(1) }
        }
    }
}
