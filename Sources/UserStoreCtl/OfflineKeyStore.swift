import UserStoreCluster
import UserStoreConfiguration
import UserStoreCore

/// The key store an offline command works on (`--offline`, `restore --from-replica --offline`,
/// `keys rewrap`): the folder or the bucket `encryption.keyStore` names, or the cluster's etcd
/// (`keyStore: etcd`, `cluster.etcd`) — the one the daemon opens.
public enum OfflineKeyStore {
    /// Opens `configuration`'s key store.
    public static func open(_ configuration: DaemonConfiguration, _ encryption: EncryptionSettings) throws(CtlError) -> any KeyStore {
        do {
            return try encryption.openKeyStore(clusterEtcd: configuration.cluster?.etcd)
        } catch {
            throw CtlError(.unreachable, "userstorectl: encryption: KeyStoreUnavailable: \(error)")
        }
    }

    /// Refuses while any daemon sharing `store` runs: a cluster's live hosts (etcd's host
    /// records). A rotation must not meet a daemon still wrapping new users' keys under the old
    /// key, nor one failing to unwrap records already rewrapped. (A folder or a bucket shared by
    /// several hosts cannot be checked so: docs/encryption.md asks to stop them all.)
    static func refuseWhileHostsRun(_ store: any KeyStore) async throws(CtlError) {
        guard let etcd = store as? EtcdKeyStore else { return }
        let hosts: [String]
        do {
            hosts = try await etcd.liveHosts()
        } catch {
            throw CtlError(.unreachable, "userstorectl: the cluster's etcd: \(error)")
        }
        if !hosts.isEmpty {
            throw CtlError(.unreachable, "userstorectl: stop every userstored of the cluster first: \(hosts.sorted().joined(separator: ", ")) \(hosts.count == 1 ? "is" : "are") running (a host stopped by SIGKILL leaves when its lease ends)")
        }
    }
}
