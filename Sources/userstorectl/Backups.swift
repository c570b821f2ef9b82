import ArgumentParser
import UserStoreConfiguration
import UserStoreCore
import UserStoreCtl
import UserStoreInterface
import UserStoreReplication
import Varlink

extension UserStoreCtlCommand {
    struct Backups: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the backups of a user's store, oldest first.")

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The user ID.")
        var user: String

        func run() async throws {
            let backups = try await connection.client().call(.listBackups, ["user": .string(user)])["backups"]?.arrayValue ?? []
            if connection.json { return backups.forEach { connection.output.jsonLine($0) } }
            connection.output.table(["TAKEN AT", "VERSION", "REASON", "BYTES", "FILE"], backups.map { backup in
                [Output.cell(backup["takenAt"]), Output.cell(backup["schemaVersion"]), Output.cell(backup["reason"]),
                 Output.cell(backup["bytes"]), String(Output.cell(backup["path"]).split(separator: "/").last ?? "")]
            })
        }
    }

    struct Restore: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace a user's store with one of its backups (the live store is copied first).",
            discussion: """
                BACKUP is a file name or path from `userstorectl backups USER`. With --from-replica instead, the store \
                comes back from the replication replica (docs/replication.md): its latest state, or its state at \
                --timestamp (RFC 3339). Either way the copy is integrity-checked first, the live store is kept as a \
                backup (reason before-restore), and the next request migrates the restored store as usual.

                With --from-replica --offline --to PATH no daemon is asked: the store is rebuilt from the replica's \
                log (replication.engine: log) named by --config, integrity-checked and written to PATH, a new file; \
                the data directory is not touched. Exit 1 with the error's name (NoSuchStore, ReplicaDamaged, \
                ReplicationUnavailable, StorageFailure) when nothing is written.
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

        @Flag(help: "With --from-replica: read the replica directly, no daemon needed; writes the store to --to.")
        var offline = false

        @Option(help: "With --offline: the daemon's configuration file, for its replica and credentials.")
        var config = "/etc/userstore/userstored.yaml"

        @Option(help: "With --offline: where to write the store (a new file; nothing is overwritten).")
        var to: String?

        func validate() throws {
            if fromReplica && backup != nil { throw ValidationError("give a BACKUP or --from-replica, not both") }
            if !fromReplica && backup == nil { throw ValidationError("missing BACKUP (or --from-replica)") }
            if timestamp != nil && !fromReplica { throw ValidationError("--timestamp needs --from-replica") }
            if offline && !fromReplica { throw ValidationError("--offline needs --from-replica") }
            if offline != (to != nil) { throw ValidationError("--offline and --to PATH go together") }
            if let timestamp, RFC3339.parse(timestamp) == nil { throw ValidationError("--timestamp must be an RFC 3339 time, e.g. 2026-11-23T18:00:00Z (got \"\(timestamp)\")") }
        }

        func run() async throws {
            if offline { return try await restoreOffline() }
            if fromReplica { return try await restoreFromReplica() }
            let backup = self.backup!
            let result = try await connection.client().call(.restoreStore, ["user": .string(user), "backup": .string(backup)])
            if connection.json { return connection.output.jsonLine(.object(result)) }
            print("restored the store of '\(user)' from \(Output.cell(result["backup"]?["path"])) (schema version \(Output.cell(result["schemaVersion"])))")
            if let previous = result["previous"]?.stringValue { print("the previous store is kept as \(previous)") }
        }

        /// `--from-replica --offline --to PATH`: the store rebuilt by this process from the replica.
        private func restoreOffline() async throws {
            let configuration: DaemonConfiguration
            do {
                configuration = try await ConfigurationLoader.load(path: config)
            } catch {
                throw CtlError(.usage, "\(error)")
            }
            guard let settings = configuration.replication else {
                throw CtlError(.usage, "\(config) has no replication section: there is no replica to restore from")
            }
            let user = self.user, path = to!, when = timestamp.flatMap(RFC3339.parse)
            // An encrypted user is checked with its key, as the daemon would.
            var keyring: StoreKeyring?
            if let encryption = configuration.encryption {
                let store = try OfflineKeyStore.open(configuration, encryption)
                do {
                    keyring = try await encryption.makeKeyring(store: store)
                } catch {
                    throw CtlError(.usage, "encryption: \(error)")
                }
            }
            let started = ContinuousClock.now
            let restored: LogRestorer.Restored
            do {
                // On the blocking pool's threads: it decodes the log and writes the file.
                restored = try await BlockingPool.executing { [keyring] in
                    try await OfflineRestore.restore(user, settings: settings, cluster: configuration.cluster != nil, to: path, timestamp: when, keyring: keyring)
                }
            } catch let failure as OfflineRestore.Failure {
                throw CtlError(.someFailed, "\(failure.name): \(failure.description)")
            }
            let milliseconds = Double((ContinuousClock.now - started).wholeMicroseconds) / 1000
            if connection.json {
                return connection.output.jsonLine(.object(["user": .string(user), "path": .string(path), "txid": .integer(Int64(restored.txid)),
                                                           "epoch": .integer(restored.epoch), "pages": .integer(Int64(restored.databasePages))]))
            }
            print("wrote the store of '\(user)' from the replica to \(path)\(timestamp.map { " as of \($0)" } ?? "") "
                  + "(\(restored.databasePages) pages, \(String(format: "%.1f", milliseconds)) ms)")
        }

        private func restoreFromReplica() async throws {
            var parameters: [String: JSONValue] = ["user": .string(user)]
            if let timestamp { parameters["timestamp"] = .string(timestamp) }
            let result = try await connection.client().call(.restoreFromReplica, parameters)
            if connection.json { return connection.output.jsonLine(.object(result)) }
            let milliseconds = Double(result["durationMicroseconds"]?.integerValue ?? 0) / 1000
            print("restored the store of '\(user)' from \(Output.cell(result["source"]))\(timestamp.map { " as of \($0)" } ?? "") "
                  + "(schema version \(Output.cell(result["schemaVersion"])), \(String(format: "%.1f", milliseconds)) ms)")
            if let previous = result["previous"]?.stringValue { print("the previous store is kept as \(previous)") }
        }
    }
}
