import Foundation
import UserStoreCore

extension EncryptionSettings {
    /// Why encryption cannot start; the daemon exits 78 with it (`name` goes into the journal's
    /// `ERROR` field).
    public struct Refusal: Error, CustomStringConvertible {
        /// `KeyEncryptionKeyMissing`, `KeyEncryptionKeyWrong` or `KeyStoreUnavailable`.
        public let name: String
        public let description: String

        public init(name: String, description: String) {
            self.name = name
            self.description = description
        }
    }

    /// The keyring these settings describe: the key-encryption key read (from the credential in
    /// `credentialsDirectory`, else `keyFile`) and checked against the key store (a new key
    /// store gets its check record).
    /// `keyStore`: the key store these settings name, opened by the caller
    /// (`openKeyStore(clusterEtcd:)`: a bucket needs the replication's S3 client, etcd the
    /// cluster's client).
    public func makeKeyring(store keyStore: any KeyStore,
                            credentialsDirectory: String? = ProcessInfo.processInfo.environment["CREDENTIALS_DIRECTORY"]) async throws(Refusal) -> StoreKeyring {
        guard let file = keyFilePath(credentialsDirectory: credentialsDirectory) else {
            throw Refusal(name: "KeyEncryptionKeyMissing", description: "encryption.credential \(credential ?? "") names a systemd credential, but the daemon was given none ($CREDENTIALS_DIRECTORY is not set: LoadCredentialEncrypted= in the unit)")
        }
        let keyring: StoreKeyring
        do {
            keyring = try StoreKeyring(keyFile: file, store: keyStore)
        } catch {
            throw Refusal(name: "KeyEncryptionKeyMissing", description: "the key-encryption key: \(error)")
        }
        do {
            try await keyring.verify()
        } catch {
            switch error {
            case .wrongKey: throw Refusal(name: "KeyEncryptionKeyWrong", description: error.description)
            case .keyStoreUnavailable: throw Refusal(name: "KeyStoreUnavailable", description: error.description)
            case .rotationUnderWay: throw Refusal(name: "KeyRotationUnderWay", description: error.description)
            }
        }
        return keyring
    }
}
