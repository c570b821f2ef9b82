import Crypto
import Foundation

/// The numbered migrations the daemon knows, in ascending version order. Immutable once loaded:
/// reloading builds a new set.
public struct MigrationSet: Sendable, Equatable {
    /// The migrations, ascending by version.
    public let migrations: [Migration]
    /// The highest version, or 0 when there are no migrations.
    public let latestVersion: Int64
    /// Fingerprint of the set of versions (see ``versionsFingerprint(_:)``); stored in each
    /// store's `app_version` row so that a current store is recognised without reading
    /// `schema_migrations`.
    public let fingerprint: String
    /// The desired schema reconciled after the numbered migrations, if one is configured.
    public private(set) var schema: DesiredSchema?
    private let indexByVersion: [Int64: Int]

    /// A set of already-parsed migrations. Throws when two share a version.
    public init(_ migrations: [Migration]) throws(MigrationSetError) {
        let sorted = migrations.sorted { $0.version < $1.version }
        var index: [Int64: Int] = [:]
        var problems: [MigrationProblem] = []
        for (position, migration) in sorted.enumerated() {
            if let previous = index[migration.version] {
                problems.append(.duplicateVersion(version: migration.version, files: [sorted[previous].fileName, migration.fileName]))
            } else {
                index[migration.version] = position
            }
        }
        guard problems.isEmpty else { throw MigrationSetError(problems: problems) }
        self.migrations = sorted
        self.latestVersion = sorted.last?.version ?? 0
        self.indexByVersion = index
        self.fingerprint = Self.versionsFingerprint(sorted.map(\.version))
    }

    /// This set with `schema` reconciled after its migrations.
    public func with(schema: DesiredSchema?) -> MigrationSet {
        var copy = self
        copy.schema = schema
        return copy
    }

    /// The empty set.
    public static let empty = try! MigrationSet([])

    /// The migration with `version`, if known.
    public func migration(version: Int64) -> Migration? {
        indexByVersion[version].map { migrations[$0] }
    }

    /// A short stable hash of a list of versions (order-insensitive).
    public static func versionsFingerprint(_ versions: [Int64]) -> String {
        let text = versions.sorted().map(String.init).joined(separator: ",")
        let hex = Array("0123456789abcdef".utf8)
        var digits: [UInt8] = []
        digits.reserveCapacity(16)
        for byte in SHA256.hash(data: Array(text.utf8)).prefix(8) {
            digits.append(hex[Int(byte >> 4)])
            digits.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: digits, as: UTF8.self)
    }

    /// Loads every `*.sql` file of `directory`. Other files (README, editor backups) are ignored.
    /// Throws ``MigrationSetError`` listing every problem, each naming its file(s).
    public static func load(directory: String) throws(MigrationSetError) -> MigrationSet {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw MigrationSetError(problems: [.unreadableDirectory(path: directory, message: (error as NSError).localizedDescription)])
        }
        var problems: [MigrationProblem] = []
        var migrations: [Migration] = []
        var filesByVersion: [Int64: [String]] = [:]
        for fileName in names.sorted() where fileName.hasSuffix(".sql") && !fileName.hasPrefix(".") {
            do throws(MigrationProblem) {
                let (version, name) = try parseFileName(fileName)
                filesByVersion[version, default: []].append(fileName)
                let path = directory + "/" + fileName
                guard let data = FileManager.default.contents(atPath: path) else {
                    throw .unreadableFile(file: fileName, message: "no such file or permission denied")
                }
                guard let text = String(validatingUTF8Data: data) else {
                    throw .unreadableFile(file: fileName, message: "not valid UTF-8")
                }
                migrations.append(try MigrationFileParser.parse(version: version, name: name, fileName: fileName, contents: text))
            } catch {
                problems.append(error)
            }
        }
        for (version, files) in filesByVersion.sorted(by: { $0.key < $1.key }) where files.count > 1 {
            problems.append(.duplicateVersion(version: version, files: files))
        }
        guard problems.isEmpty else { throw MigrationSetError(problems: problems) }
        return try MigrationSet(migrations)
    }

    /// `(version, name)` from `0001_name.sql`, `12-name.sql` or `0003.sql`.
    public static func parseFileName(_ fileName: String) throws(MigrationProblem) -> (Int64, String) {
        let stem = fileName.dropLast(".sql".count)
        let digits = stem.prefix(while: { $0.isASCII && $0.isNumber })
        guard !digits.isEmpty else { throw .malformedFileName(file: fileName) }
        let rest = stem.dropFirst(digits.count)
        var name = ""
        if let separator = rest.first {
            guard separator == "_" || separator == "-", rest.count > 1 else { throw .malformedFileName(file: fileName) }
            name = String(rest.dropFirst())
        }
        guard let version = Int64(digits), version >= 1, version <= Int64(Int32.max) else {
            throw .versionOutOfRange(file: fileName)
        }
        return (version, name)
    }
}

extension String {
    /// Decodes `data` as UTF-8, or nil when it is not valid UTF-8.
    init?(validatingUTF8Data data: Data) {
        guard let text = String(data: data, encoding: .utf8) else { return nil }
        self = text
    }
}
