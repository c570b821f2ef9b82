import Foundation
import UserStoreConfiguration
import UserStoreCore
import UserStoreReplication

/// `encryption.keyStore: etcd` in a cluster (docs/encryption.md): the wrapped data keys as etcd
/// keys `/us/v1/keys/<record>` (values in base64), beside the cluster's own records; a put is
/// durable once etcd answers it (committed by a majority of its members). No thread waits for
/// it: the etcd client's event loop does.
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
    public func liveHosts() async throws -> [String] {
        try await etcd.list(prefix: HostMembership.prefix).map { String($0.key.dropFirst(HostMembership.prefix.count)) }
    }

    public func read(_ name: String) async throws -> [UInt8]? {
        guard let found = try await etcd.get(Self.prefix + name) else { return nil }
        guard let bytes = Data(base64Encoded: String(decoding: found.value, as: UTF8.self)) else {
            throw Malformed(description: "etcd key \(Self.prefix + name) is not base64")
        }
        return Array(bytes)
    }

    public func write(_ name: String, _ bytes: [UInt8]) async throws {
        _ = try await etcd.put(Self.prefix + name, Data(bytes).base64EncodedString())
    }

    public func remove(_ name: String) async throws {
        _ = try await etcd.delete(Self.prefix + name)
    }

    public func names(under folder: String) async throws -> [String] {
        try await etcd.list(prefix: Self.prefix + folder).map { String($0.key.dropFirst(Self.prefix.count)) }
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
