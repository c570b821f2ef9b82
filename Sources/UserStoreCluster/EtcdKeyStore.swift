import Foundation
import UserStoreConfiguration
import UserStoreCore
import UserStoreReplication

/// `encryption.keyStore: etcd` in a cluster (docs/encryption.md): the wrapped data keys as etcd
/// keys `/us/v1/keys/<record>` (values in base64), beside the cluster's own records; a put is
/// durable once etcd answers it (committed by a majority of its members). Blocking, like every
/// key store: each call waits for etcd's answer with ``BlockingPool/wait(for:)`` (the
/// daemon calls it on the blocking pool; userstorectl's offline commands and `keys rewrap` on
/// their main task).
public struct EtcdKeyStore: KeyStore {
    let etcd: EtcdClient
    let endpoints: [String]
    public static let prefix = "/us/v1/keys/"

    public init(etcd: EtcdClient, endpoints: [String]) {
        self.etcd = etcd
        self.endpoints = endpoints
    }

    /// A record in etcd that is not what this store writes.
    public struct Malformed: Error, CustomStringConvertible {
        public let description: String
    }

    /// The hosts of the cluster that are alive now (their records under `/us/v1/hosts/`, which
    /// end with their leases): a key-encryption key's rotation waits until there are none.
    public func liveHosts() throws -> [String] {
        let etcd = self.etcd
        return try BlockingPool.wait { try await etcd.list(prefix: HostMembership.prefix) }.map { String($0.key.dropFirst(HostMembership.prefix.count)) }
    }

    public func read(_ name: String) throws -> [UInt8]? {
        let etcd = self.etcd
        let value = try BlockingPool.wait { try await etcd.get(Self.prefix + name) }
        return try value.map { found in
            guard let bytes = Data(base64Encoded: String(decoding: found.value, as: UTF8.self)) else {
                throw Malformed(description: "etcd key \(Self.prefix + name) is not base64")
            }
            return Array(bytes)
        }
    }

    public func write(_ name: String, _ bytes: [UInt8]) throws {
        let etcd = self.etcd, value = Data(bytes).base64EncodedString()
        _ = try BlockingPool.wait { try await etcd.put(Self.prefix + name, value) }
    }

    public func remove(_ name: String) throws {
        let etcd = self.etcd
        _ = try BlockingPool.wait { try await etcd.delete(Self.prefix + name) }
    }

    public func names(under folder: String) throws -> [String] {
        let etcd = self.etcd
        return try BlockingPool.wait { try await etcd.list(prefix: Self.prefix + folder) }.map { String($0.key.dropFirst(Self.prefix.count)) }
    }

    public var location: String { "etcd (\(endpoints.joined(separator: ", ")))\(Self.prefix)" }
}

extension EncryptionSettings {
    /// The key store these settings name, opened: a folder or a bucket (``openKeyStore()``), or
    /// the cluster's etcd at `clusterEtcd` (`cluster.etcd`, which the configuration requires
    /// with `keyStore: etcd`). The daemon and userstorectl's offline commands open it here.
    package func openKeyStore(clusterEtcd endpoints: [String]?) throws -> any KeyStore {
        if let store = try openKeyStore() { return store }
        let endpoints = endpoints ?? []
        return EtcdKeyStore(etcd: EtcdClient(endpoints: endpoints), endpoints: endpoints)
    }
}
