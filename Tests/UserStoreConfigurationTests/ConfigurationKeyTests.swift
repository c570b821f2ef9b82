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
        #expect(ConfigurationKey.sections == ["migrations", "rollout", "watch", "access", "limits", "metrics", "replication", "replication.s3", "cluster", "cluster.tls"])
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

    /// The daemon's own log is the default engine, but not for an sftp:// replica (the log cannot
    /// list or write one): that stays on Litestream; a named engine always wins.
    @Test func theLogIsTheDefaultEngineButNotForAnSFTPReplica() async throws {
        let header = "appVersion: \"1.0.0\"\nreplication:\n"
        #expect(try await Self.load(header + "  replica: \"file:///tmp/r\"\n").replication?.engine == .log)
        #expect(try await Self.load(header + "  replica: \"s3://bucket/prefix\"\n").replication?.engine == .log)
        #expect(try await Self.load(header + "  replica: \"sftp://u@h/p\"\n").replication?.engine == .litestream)
        #expect(try await Self.load(header + "  replica: \"file:///tmp/r\"\n  engine: litestream\n").replication?.engine == .litestream)
    }
}
