import Foundation

/// `<dataDirectory>/release.json`: the release in force, kept by the daemon (and read by
/// `userstorectl --offline`, so that a fleet run with the daemon stopped honours it too).
public enum ReleaseFile {
    /// The file of `dataDirectory`'s release.
    public static func path(dataDirectory: String) -> String { dataDirectory + "/release.json" }

    /// The release kept at `path`, or nil when there is no file. Throws ``ReleaseFileError``
    /// when it exists but cannot be read or decoded.
    public static func read(_ path: String) throws(ReleaseFileError) -> Release? {
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        do {
            return try decoder.decode(Release.self, from: Data(contentsOf: URL(fileURLWithPath: path)))
        } catch {
            throw ReleaseFileError(path: path, problem: "\(error)")
        }
    }

    /// Writes `release` to `path` durably (``DurableFile/write(_:to:)``).
    public static func write(_ release: Release, to path: String) throws {
        try DurableFile.write(try encode(release), to: path)
    }

    /// `release` as the JSON text kept in the file (and in etcd, for a cluster).
    public static func encode(_ release: Release) throws -> String {
        String(decoding: try encoder.encode(release), as: UTF8.self)
    }

    /// A release from its JSON text.
    public static func decode(_ bytes: [UInt8]) throws -> Release {
        try decoder.decode(Release.self, from: Data(bytes))
    }

    /// The release in force for `migrations`: the one kept at `path`, or — when `migrations`'
    /// versions are not its — the release they start after it (staged by `policy`), or the
    /// baseline when there is no file. `started`: whether a new release begins with them.
    public static func current(at path: String, migrations: MigrationSet, policy: RolloutPolicy?,
                               now: Date = Date()) throws(ReleaseFileError) -> (release: Release, started: Bool) {
        let versions = migrations.migrations.map(\.version)
        let kept = try read(path) ?? .baseline(versions: versions, fingerprint: migrations.fingerprint, now: now)
        guard kept.fingerprint != migrations.fingerprint else { return (kept, false) }
        return (kept.successor(versions: versions, fingerprint: migrations.fingerprint, policy: policy, now: now), true)
    }

    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        return encoder
    }()

    private static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()
}

/// `release.json` exists but cannot be read: the daemon does not start (serving without it
/// would let every store migrate, whatever step the release had reached).
public struct ReleaseFileError: Error, CustomStringConvertible {
    public let path: String
    public let problem: String
    public var description: String {
        "\(path) cannot be read (\(problem)): it holds the state of the release in progress; fix it, or move it aside to start with the migrations loaded now as the baseline"
    }
}

/// A release that does not change (a fleet run with the daemon stopped) as the registry's gate.
public struct FixedReleaseGate: MigrationGate {
    public let release: Release
    public init(_ release: Release) { self.release = release }
    public func allowedVersions(for user: UserID) -> Set<Int64>? { release.allowedVersions(for: user) }
}
