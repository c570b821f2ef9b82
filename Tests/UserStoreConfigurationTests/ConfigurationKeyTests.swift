import Foundation
import Testing
@testable import UserStoreConfiguration

/// The configuration's one list of keys (``ConfigurationKey``): documented, refused when
/// misspelt, overridable from the environment.
struct ConfigurationKeyTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// A configuration file in a fresh folder, loaded with `environment`.
    static func load(_ yaml: String, environment: [String: String] = [:]) async throws -> DaemonConfiguration {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("configuration-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("userstored.yaml").path
        try yaml.write(toFile: file, atomically: true, encoding: .utf8)
        return try await ConfigurationLoader.load(path: file, environment: environment)
    }

    @Test func everyKeyIsDocumented() throws {
        let documentation = try String(contentsOf: Self.repository.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        let undocumented = ConfigurationKey.allCases.filter { !documentation.contains("| `\($0.rawValue)` |") }
        #expect(undocumented.isEmpty, "not in docs/configuration.md's tables: \(undocumented.map(\.rawValue))")
    }

    @Test func sectionsComeFromTheKeys() {
        #expect(ConfigurationKey.sections == ["migrations", "rollout", "watch", "access", "limits", "metrics", "replication", "replication.s3", "encryption", "cluster", "cluster.tls"])
    }

    @Test func aMisspeltKeyIsRefusedWithTheNearestOne() async throws {
        await #expect { _ = try await Self.load("appVersion: \"1.0.0\"\nlimits:\n  maxConections: 5\n") } throws: { error in
            guard let error = error as? ConfigurationError else { return false }
            return error.key == "limits.maxConections" && error.problem.contains("did you mean 'limits.maxConnections'?")
        }
    }

    @Test func everyKeyHasItsEnvironmentOverride() async throws {
        #expect(ConfigurationLoader.environmentName(of: ConfigurationKey.limitsMaxConnections.rawValue) == "USERSTORED_LIMITS_MAX_CONNECTIONS")
        let configuration = try await Self.load("appVersion: \"1.0.0\"\n", environment: ["USERSTORED_LIMITS_MAX_CONNECTIONS": "7"])
        #expect(configuration.limits.maxConnections == 7)
        #expect(Set(ConfigurationKey.allCases.map { ConfigurationLoader.environmentName(of: $0.rawValue) }).count == ConfigurationKey.allCases.count)
    }

    /// A bad value from the environment names the variable, not the file; one from the file names the file.
    @Test func aBadValueNamesWhereItCameFrom() async throws {
        await #expect { _ = try await Self.load("appVersion: \"1.0.0\"\n", environment: ["USERSTORED_LIMITS_MAX_CONNECTIONS": "abc"]) } throws: { error in
            let text = "\(error)"
            return text.hasPrefix("environment variable USERSTORED_LIMITS_MAX_CONNECTIONS (overriding key 'limits.maxConnections' of ")
                && text.contains("must be an integer")
        }
        await #expect { _ = try await Self.load("appVersion: \"1.0.0\"\nlimits:\n  maxConnections: abc\n") } throws: { error in
            let text = "\(error)"
            return text.contains("userstored.yaml: key 'limits.maxConnections': ") && !text.contains("environment")
        }
    }

    /// The key store may not share the replica's place — the same prefix, one inside it, or one
    /// holding it, on S3 or in folders: the keys would travel with the data. Beside it is fine.
    @Test func aKeyStoreInsideTheReplicaOrHoldingItIsRefused() async throws {
        let key = FileManager.default.temporaryDirectory.appendingPathComponent("kek-\(UUID().uuidString)").path
        try (Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString() + "\n").write(toFile: key, atomically: true, encoding: .utf8)
        defer { unlink(key) }
        func load(replica: String, keyStore: String) async throws -> DaemonConfiguration {
            try await Self.load("appVersion: \"1.0.0\"\nreplication:\n  replica: \"\(replica)\"\nencryption:\n  keyFile: \(key)\n  keyStore: \"\(keyStore)\"\n")
        }
        for (replica, keyStore) in [("s3://b/r", "s3://b/r"), ("s3://b/r", "s3://b/r/keys"), ("s3://b/r/data", "s3://b/r"), ("s3://b", "s3://b/keys"),
                                    ("file:///srv/replica", "file:///srv/replica/keys"), ("file:///srv/replica", "file:///srv"),
                                    ("file:///srv/replica", "file:///srv/keys/../replica/k"), ("file:///tmp/r", "file:///tmp/./r//keys/")] {
            await #expect("\(keyStore) with the replica at \(replica)") { _ = try await load(replica: replica, keyStore: keyStore) } throws: {
                "\($0)".contains("key 'encryption.keyStore'") && "\($0)".contains("keep the keys apart from the data")
            }
        }
        // Through a symbolic link to the replica's folder.
        let real = FileManager.default.temporaryDirectory.appendingPathComponent("replica-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: real, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: real + "-link", withDestinationPath: real)
        defer { try? FileManager.default.removeItem(atPath: real); unlink(real + "-link") }
        await #expect { _ = try await load(replica: "file://" + real, keyStore: "file://\(real)-link/keys") } throws: {
            "\($0)".contains("keep the keys apart from the data")
        }
        for (replica, keyStore) in [("s3://b/r", "s3://b/rk"), ("s3://b/r", "s3://other/r"), ("file:///srv/replica", "file:///srv/replica-keys"),
                                    ("file:///srv/replica", "file:///srv/replica/../keys")] {
            #expect(try await load(replica: replica, keyStore: keyStore).encryption != nil, "\(keyStore) with the replica at \(replica)")
        }
    }

    /// `cacheIdleSeconds`: 1 by default, 0 turns the release off, a negative value is refused.
    @Test func cacheIdleSecondsReachesTheRegistry() async throws {
        #expect(try await Self.load("appVersion: \"1.0.0\"\n").registryConfiguration.cacheIdle == .seconds(1))
        #expect(try await Self.load("appVersion: \"1.0.0\"\ncacheIdleSeconds: 30\n").registryConfiguration.cacheIdle == .seconds(30))
        #expect(try await Self.load("appVersion: \"1.0.0\"\ncacheIdleSeconds: 0\n").registryConfiguration.cacheIdle == nil)
        await #expect { _ = try await Self.load("appVersion: \"1.0.0\"\ncacheIdleSeconds: -1\n") } throws: { "\($0)".contains("key 'cacheIdleSeconds'") }
    }

    /// Litestream is retired: the keys of its time are accepted (each named as unused, a wrong
    /// value still refused by name), `engine: litestream` means the log, and an sftp:// replica —
    /// which only Litestream wrote — is refused by name rather than left unreplicated.
    @Test func litestreamsKeysAreAcceptedAndUnusedAndSFTPIsRefusedByName() async throws {
        let header = "appVersion: \"1.0.0\"\nreplication:\n  replica: \"file:///tmp/r\"\n"
        #expect(try await Self.load(header).replication?.unusedKeys == [])
        #expect(try await Self.load(header + "  engine: log\n").replication?.unusedKeys == [])
        let old = "  engine: litestream\n  syncIntervalMilliseconds: 500\n  maxRegisteredStores: 10\n  socket: /run/l.sock\n"
            + "  startLitestream: false\n  restartUnresponsiveSeconds: 5\n  litestreamMetricsAddress: 127.0.0.1:9090\n  litestream: /usr/bin/litestream\n"
        let loaded = try await Self.load(header + old).replication
        #expect(loaded?.unusedKeys == ["replication.engine", "replication.syncIntervalMilliseconds", "replication.maxRegisteredStores", "replication.socket",
                                       "replication.startLitestream", "replication.restartUnresponsiveSeconds", "replication.litestreamMetricsAddress"])
        #expect(loaded?.litestream == "/usr/bin/litestream")
        for (yaml, key) in [("  engine: raft\n", "replication.engine"), ("  syncIntervalMilliseconds: 5\n", "replication.syncIntervalMilliseconds"),
                            ("  litestreamMetricsAddress: unix:/x\n", "replication.litestreamMetricsAddress")] {
            await #expect { _ = try await Self.load(header + yaml) } throws: { "\($0)".contains("key '\(key)'") }
        }
        await #expect { _ = try await Self.load("appVersion: \"1.0.0\"\nreplication:\n  replica: \"sftp://u@h/p\"\n") } throws: { error in
            "\(error)".contains("key 'replication.replica'") && "\(error)".contains("sftp:// replicas are no longer served")
        }
    }
}
