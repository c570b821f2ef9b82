import Foundation

/// A CA and one certificate per host for the daemons' mutual TLS, made by the repository's own
/// scripts/cluster-certs.sh (openssl) in a temporary folder removed at the end.
public final class ClusterCertificates: @unchecked Sendable {
    public let directory: String

    /// Certificates for `hosts` (name → the address it is reached at: an IP or a DNS name).
    public init(_ hosts: [String: String]) throws {
        directory = NSTemporaryDirectory() + "certs-\(UUID().uuidString)"
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/cluster-certs.sh").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [script, directory] + hosts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw NSError(domain: "ClusterCertificates", code: Int(process.terminationStatus), userInfo: [NSLocalizedDescriptionKey: "cluster-certs.sh failed"])
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    /// The `cluster.tls` section for `host`.
    public func tls(for host: String) -> String {
        """
          tls:
            certificate: \(directory)/\(host).pem
            key: \(directory)/\(host).key
            ca: \(directory)/ca.pem
        """
    }

    public func certificate(_ host: String) -> String { "\(directory)/\(host).pem" }
    public func key(_ host: String) -> String { "\(directory)/\(host).key" }
    public var ca: String { "\(directory)/ca.pem" }
}
