import Foundation
import UserStoreConfiguration
import UserStoreCore
import UserStoreProtocol
import Varlink

/// `--offline`: the data directory worked on directly, while userstored is stopped, under the
/// same cross-process lock the daemon holds (so it refuses while the daemon runs).
public final class OfflineFleet {
    public let configuration: DaemonConfiguration
    public let registry: StoreRegistry
    private let lock: DataDirectoryLock

    public init(configurationPath: String) async throws(CtlError) {
        _ = SQLiteProcessSettings.apply() // before anything opens a database; as frugal as the daemon
        do {
            configuration = try await ConfigurationLoader.load(path: configurationPath)
        } catch {
            throw CtlError(.usage, "userstorectl: \(error)")
        }
        let migrations: MigrationSet
        do {
            migrations = try ConfigurationLoader.loadMigrations(configuration)
        } catch {
            throw CtlError(.someFailed, "userstorectl: \(error)")
        }
        let layout = StoreLayout(dataDirectory: configuration.dataDirectory)
        do {
            lock = try DataDirectoryLock(layout: layout)
        } catch {
            if case .held(_, let pid) = error {
                throw CtlError(.unreachable, "userstorectl: userstored\(pid.map { " (pid \($0))" } ?? "") holds the data directory \(configuration.dataDirectory); stop it, or run without --offline to go through it")
            }
            throw CtlError(.unreachable, "userstorectl: \(error)")
        }
        // The daemon's release, as the daemon would see it with these migrations: a fleet run
        // with the daemon stopped migrates only what a staged release lets migrate.
        let release: Release
        do {
            release = try ReleaseFile.current(at: ReleaseFile.path(dataDirectory: configuration.dataDirectory), migrations: migrations,
                                              policy: configuration.rollout).release
        } catch {
            throw CtlError(.someFailed, "userstorectl: \(error)")
        }
        // Encrypted stores are read with their keys, as the daemon reads them (the
        // key-encryption key from encryption.keyFile, or the credential in $CREDENTIALS_DIRECTORY;
        // the key store a folder, a bucket or the cluster's etcd).
        var registryConfiguration = configuration.registryConfiguration
        if let encryption = configuration.encryption {
            let store = try OfflineKeyStore.open(configuration, encryption)
            do {
                registryConfiguration.keyring = try await encryption.makeKeyring(store: store)
            } catch {
                throw CtlError(.usage, "userstorectl: encryption: \(error.name): \(error)")
            }
        }
        registry = StoreRegistry(configuration: registryConfiguration, migrations: migrations, lock: lock,
                                 gate: FixedReleaseGate(release))
    }

    /// Every store of the data directory.
    public func users() -> [UserID] {
        registry.configuration.layout.allUsers().sorted()
    }

    /// Status counts read from the store files' headers.
    public func status() async -> [String: JSONValue] {
        let latest = registry.migrations.latestVersion
        var counts = ["current": 0, "pending": 0, "tooNew": 0, "unknown": 0]
        let users = self.users()
        for user in users {
            let path = registry.configuration.layout.storePath(for: user)
            // An encrypted store's WAL is read with its user's key (none: unreadable), fetched
            // only for a store whose header does not say.
            let cipher = (try? await StoreKeyring.cipher(ifEncrypted: path, user: user, keyring: registry.configuration.keyring)) ?? nil
            let version = StoreFileInspector.schemaVersion(of: path, cipher: cipher)
            if version < 0 { counts["unknown"]! += 1 } else if version > latest { counts["tooNew"]! += 1 } else if version == latest { counts["current"]! += 1 } else { counts["pending"]! += 1 }
        }
        return [
            "offline": true, "appVersion": .string(configuration.appVersion.text), "latestSchemaVersion": .integer(latest),
            "migrations": .integer(Int64(registry.migrations.migrations.count)), "dataDirectory": .string(configuration.dataDirectory),
            "knownStores": .integer(Int64(users.count)), "currentStores": .integer(Int64(counts["current"]!)),
            "pendingStores": .integer(Int64(counts["pending"]!)), "tooNewStores": .integer(Int64(counts["tooNew"]!)),
            "unreadableStores": .integer(Int64(counts["unknown"]!)),
        ]
    }

    /// Runs `operation` over `users`, `parallel` at a time, reporting each outcome as it
    /// finishes; Ctrl-C stops starting new stores. Closes every store at the end.
    public func forEach(_ users: [UserID], parallel: Int, _ operation: @escaping @Sendable (StoreRegistry, UserID) async -> [String: JSONValue],
                        report: ([String: JSONValue]) -> Void) async {
        let registry = self.registry
        try? await FleetRunner.run(users, parallel: parallel, stop: { Interrupt.requested },
                                   operation: { await operation(registry, $0) }, report: { _, outcome in report(outcome) })
        await registry.shutdown()
    }
}
