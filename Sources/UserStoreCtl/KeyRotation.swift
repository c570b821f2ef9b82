import Foundation
import UserStoreConfiguration
import UserStoreCore

/// `userstorectl keys rewrap`: the key-encryption key's rotation, done on the key store directly
/// while userstored is stopped (the data directory's lock held), as ``StoreKeyring/rewrap(to:progress:)``
/// describes.
public enum KeyRotation {
    /// The keyring of the configuration's key store with the current key, the new key (as a
    /// keyring), and the lock that keeps the daemon from starting meanwhile.
    public static func prepare(configurationPath: String, keyFile: String?, newKeyFile: String) async throws(CtlError) -> (StoreKeyring, StoreKeyring, DataDirectoryLock) {
        let configuration: DaemonConfiguration
        do {
            configuration = try await ConfigurationLoader.load(path: configurationPath)
        } catch {
            throw CtlError(.usage, "userstorectl: \(error)")
        }
        guard let encryption = configuration.encryption else {
            throw CtlError(.usage, "userstorectl: \(configurationPath) has no encryption section: there is no key store to rewrap")
        }
        guard let current = keyFile ?? encryption.keyFile else {
            throw CtlError(.usage, "userstorectl: the current key-encryption key is a systemd credential the command cannot read: give it with --key-file")
        }
        let lock: DataDirectoryLock
        do {
            lock = try DataDirectoryLock(layout: StoreLayout(dataDirectory: configuration.dataDirectory))
        } catch {
            throw CtlError(.unreachable, "userstorectl: stop userstored first (\(error))")
        }
        // A folder, a bucket or the cluster's etcd, with every daemon sharing it stopped.
        let store = try OfflineKeyStore.open(configuration, encryption)
        try await OfflineKeyStore.refuseWhileHostsRun(store)
        do {
            return (try StoreKeyring(keyFile: current, store: store), try StoreKeyring(keyFile: newKeyFile, store: store), lock)
        } catch {
            throw CtlError(.usage, "userstorectl: \(error)")
        }
    }

    /// Rewraps every record of `keyring`'s key store under `next`'s key; returns how many.
    public static func run(_ keyring: StoreKeyring, to next: StoreKeyring, progress: (Int, Int) -> Void) async throws(CtlError) -> Int {
        do {
            return try await keyring.rewrap(to: next, progress: progress)
        } catch {
            throw CtlError(.someFailed, "userstorectl: keys rewrap: \(error) (run it again to go on)")
        }
    }
}
