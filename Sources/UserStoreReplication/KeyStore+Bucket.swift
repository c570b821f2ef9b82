import Foundation
import UserStoreConfiguration
import UserStoreCore

/// An `s3://` key store (`encryption.keyStore`): the wrapped data keys as objects of a bucket (or
/// a prefix) of their own, through the same S3 client and credentials as the replica. A PUT is
/// durable when S3 answers it; no thread waits for it (the S3 client's event loop does).
extension ReplicaStorage: KeyStore {
    package func read(_ name: String) async throws -> [UInt8]? { try await get(name) }
    package func write(_ name: String, _ bytes: [UInt8]) async throws { try await put(name, bytes) }
    package func remove(_ name: String) async throws { try await delete([name]) }
    package func names(under folder: String) async throws -> [String] { try await keys(under: folder) }
    package var location: String { describe("") }
}

extension EncryptionSettings {
    /// The key store these settings name: a folder, or a bucket reached like an `s3://` replica;
    /// nil for the cluster's etcd (UserStoreCluster's `openKeyStore(clusterEtcd:)` opens any).
    package func openKeyStore() throws -> (any KeyStore)? {
        switch keyStore {
        case .folder(let root):
            return FolderKeyStore(root: root)
        case .bucket(let s3):
            var settings = ReplicationSettings(replica: s3.url)
            settings.s3 = s3
            return try ReplicaStorage(settings)
        case .etcd:
            return nil
        }
    }
}
