import Configuration
import Foundation
import SystemPackage
import UserStoreCore
import Yams

/// Reads `userstored.yaml` (through swift-configuration) with environment overrides
/// (`USERSTORED_` + the key in upper snake case: `USERSTORED_DATA_DIRECTORY`,
/// `USERSTORED_LIMITS_MAX_CONNECTIONS`), validates every value and resolves relative paths
/// against the configuration file's folder, so the repository's config runs from any
/// working directory.
public enum ConfigurationLoader {
    /// Every key the file may contain (``ConfigurationKey``). A key not listed is a typo, reported as such.
    static let knownKeys: Set<String> = Set(ConfigurationKey.allCases.map(\.rawValue))

    /// The numbered migrations and the desired schema `configuration` names, loaded and checked.
    public static func loadMigrations(_ configuration: DaemonConfiguration) throws -> MigrationSet {
        let migrations = try MigrationSet.load(directory: configuration.migrationsDirectory)
        guard let schemaFile = configuration.schemaFile else { return migrations }
        return migrations.with(schema: try DesiredSchema.load(path: schemaFile))
    }

    /// Loads and validates the configuration at `path`; `environment` overrides it.
    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment) async throws(ConfigurationError) -> DaemonConfiguration {
        let absolutePath = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        guard let text = FileManager.default.contents(atPath: absolutePath).flatMap({ String(data: $0, encoding: .utf8) }) else {
            throw ConfigurationError(file: absolutePath, key: nil, problem: "cannot read the configuration file (missing, unreadable or not UTF-8)")
        }
        var present = try checkKeys(text, file: absolutePath)
        for key in knownKeys where environment[environmentName(of: key)] != nil { present.insert(key) }
        let reader: ConfigReader
        do {
            let file = try await FileProvider<YAMLSnapshot>(filePath: FilePath(absolutePath))
            let prefixed = KeyMappingProvider(upstream: EnvironmentVariablesProvider(environmentVariables: environment)) { key in
                key.prepending(["userstored"])
            }
            reader = ConfigReader(providers: [prefixed, file])
        } catch {
            throw ConfigurationError(file: absolutePath, key: nil, problem: "not valid YAML: \(error)")
        }
        do {
            return try Reader(reader: reader, file: absolutePath, present: present).configuration()
        } catch {
            // A value the environment set is the environment's fault, not the file's.
            var error = error
            if let key = error.key, environment[environmentName(of: key)] != nil { error.environmentVariable = environmentName(of: key) }
            throw error
        }
    }

    /// The environment variable that overrides `key`: `limits.maxConnections` →
    /// `USERSTORED_LIMITS_MAX_CONNECTIONS`.
    public static func environmentName(of key: String) -> String {
        var name = "USERSTORED_"
        for character in key {
            if character == "." { name += "_" } else if character.isUppercase { name += "_" + String(character) } else { name += character.uppercased() }
        }
        return name
    }

    /// Refuses unknown keys (a misspelt key would otherwise be silently ignored); returns the
    /// keys present.
    static func checkKeys(_ text: String, file: String) throws(ConfigurationError) -> Set<String> {
        let document: Any?
        do {
            document = try Yams.load(yaml: text)
        } catch {
            throw ConfigurationError(file: file, key: nil, problem: "not valid YAML: \(error)")
        }
        guard let document else { return [] }
        guard let top = document as? [String: Any] else {
            throw ConfigurationError(file: file, key: nil, problem: "the top level must be a mapping of keys to values")
        }
        let keys = flattenedKeys(top, prefix: "")
        for key in keys where !knownKeys.contains(key) {
            let hint = knownKeys.min { editDistance($0, key) < editDistance($1, key) }.map { " (did you mean '\($0)'?)" } ?? ""
            throw ConfigurationError(file: file, key: key, problem: "unknown key\(hint)")
        }
        return Set(keys)
    }

    private static func flattenedKeys(_ mapping: [String: Any], prefix: String) -> [String] {
        mapping.sorted { $0.key < $1.key }.flatMap { key, value -> [String] in
            let full = prefix.isEmpty ? key : prefix + "." + key
            if let nested = value as? [String: Any], ConfigurationKey.sections.contains(full) {
                return flattenedKeys(nested, prefix: full)
            }
            return [full]
        }
    }

    private static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a.lowercased()), b = Array(b.lowercased())
        var row = Array(0...b.count)
        for i in 1...max(a.count, 1) where !a.isEmpty {
            var previous = row[0]
            row[0] = i
            for j in 1...max(b.count, 1) where !b.isEmpty {
                let current = row[j]
                row[j] = min(row[j] + 1, row[j - 1] + 1, previous + (a[i - 1] == b[j - 1] ? 0 : 1))
                previous = current
            }
        }
        return row[b.count]
    }
}
