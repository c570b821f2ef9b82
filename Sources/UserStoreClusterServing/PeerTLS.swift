import NIOSSL
import UserStoreConfiguration

/// Mutual TLS between daemons (`cluster.tls.*`): each daemon presents its own certificate and
/// accepts only a peer whose certificate the cluster's CA signed — as a server (a daemon
/// forwarding to this one) and as a client (this one forwarding to the owner, whose certificate
/// must also name the address it is reached at). TLS 1.3 only: every daemon runs this code.
package struct PeerTLS: Sendable {
    /// For the listener (`cluster.listen`): a client certificate is required.
    package let server: NIOSSLContext
    /// For links to other daemons.
    package let client: NIOSSLContext

    /// Loads the PEM files; a file that does not parse is named by its key.
    package init(_ settings: ClusterTLS, configurationFile: String) throws(ConfigurationError) {
        func load<T>(_ key: String, _ path: String, _ body: () throws -> T) throws(ConfigurationError) -> T {
            do {
                return try body()
            } catch {
                throw ConfigurationError(file: configurationFile, key: key, problem: "\(path) is not usable: \(error)")
            }
        }
        let chain = try load("cluster.tls.certificate", settings.certificate) { try NIOSSLCertificate.fromPEMFile(settings.certificate) }
        let key = try load("cluster.tls.key", settings.key) { try NIOSSLPrivateKey(file: settings.key, format: .pem) }
        let authorities = try load("cluster.tls.ca", settings.ca) { try NIOSSLCertificate.fromPEMFile(settings.ca) }
        guard !chain.isEmpty else { throw ConfigurationError(file: configurationFile, key: "cluster.tls.certificate", problem: "\(settings.certificate) holds no certificate") }
        guard !authorities.isEmpty else { throw ConfigurationError(file: configurationFile, key: "cluster.tls.ca", problem: "\(settings.ca) holds no certificate") }

        var server = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        server.minimumTLSVersion = .tlsv13
        server.trustRoots = .certificates(authorities)
        // Any mode but .none makes the server require a client certificate
        // (SSL_VERIFY_FAIL_IF_NO_PEER_CERT); a client has no name to check.
        server.certificateVerification = .noHostnameVerification

        var client = TLSConfiguration.makeClientConfiguration()
        client.minimumTLSVersion = .tlsv13
        client.trustRoots = .certificates(authorities)
        client.certificateChain = chain.map { .certificate($0) }
        client.privateKey = .privateKey(key)
        client.certificateVerification = .fullVerification
        // A link is closed when its owner stops answering: do not wait long for its close_notify.
        client.shutdownTimeout = .seconds(1)

        self.server = try load("cluster.tls.certificate", settings.certificate) { try NIOSSLContext(configuration: server) }
        self.client = try load("cluster.tls.certificate", settings.certificate) { try NIOSSLContext(configuration: client) }
    }
}
