/// One numbered migration file, parsed and checked.
public struct Migration: Sendable, Equatable, Identifiable {
    /// The number in the file name; also the schema version the store has after it.
    public let version: Int64
    /// The part of the file name after the number (`notes` in `0001_notes.sql`).
    public let name: String
    /// The file name (`0001_notes.sql`).
    public let fileName: String
    /// Statements of the Up section, in order, ready to run inside the migration's transaction.
    public let up: [String]
    /// Statements of the Down section; nil when the file has no Down section.
    public let down: [String]?
    /// Hex SHA-256 of the Up section and directives, line-ending-insensitive (see ``MigrationChecksum``).
    public let checksum: String
    /// When set, the Up section runs only on stores whose recorded app version is below this.
    public let appVersionBelow: AppVersion?
    /// Statements found in the file and deliberately not run (transaction control and
    /// `PRAGMA foreign_keys`: the engine owns both), for linters to mention.
    public let ignoredStatements: [String]
    /// Why running the Up section can lose or change data the store holds (its first such
    /// statement, see ``DataLossClassifier``); nil when every statement only adds.
    public let dataLossReason: String?
    /// The Up section has a plain INSERT: it only adds unless the store has a trigger or an
    /// `ON CONFLICT REPLACE` clause (checked on the store when deciding on a copy).
    public let insertsRows: Bool
    /// Marked `-- Compatible`: an older daemon that does not know this migration may still serve
    /// a store that has it (every Up statement is additive; ``CompatibleChange``).
    public var compatible = false

    public var id: Int64 { version }

    /// Memberwise initialiser, for migrations built in code.
    public init(version: Int64, name: String, fileName: String, up: [String], down: [String]?,
                checksum: String, appVersionBelow: AppVersion? = nil, ignoredStatements: [String] = []) {
        self.version = version
        self.name = name
        self.fileName = fileName
        self.up = up
        self.down = down
        self.checksum = checksum
        self.appVersionBelow = appVersionBelow
        self.ignoredStatements = ignoredStatements
        (dataLossReason, insertsRows) = DataLossClassifier.risk(of: up, fileName: fileName)
    }
}
