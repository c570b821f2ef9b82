/// A problem with one file (or a pair of files) of a migrations directory.
///
/// Every case names the file(s), so an operator can fix them without guessing.
public enum MigrationProblem: Error, Equatable, Sendable, CustomStringConvertible {
    /// The directory could not be listed.
    case unreadableDirectory(path: String, message: String)
    /// A `.sql` file whose name is not `NNNN_name.sql` or `NNNN-name.sql`.
    case malformedFileName(file: String)
    /// A version of 0 or one that does not fit SQLite's 32-bit `user_version`.
    case versionOutOfRange(file: String)
    /// Two files with the same version number.
    case duplicateVersion(version: Int64, files: [String])
    /// The file could not be read or is not UTF-8.
    case unreadableFile(file: String, message: String)
    /// SQL before the first `-- Up` / `-- Down` marker.
    case textBeforeFirstSection(file: String)
    /// The same section marker twice.
    case repeatedSection(file: String, section: String)
    /// No statement in the Up section.
    case missingUp(file: String)
    /// A statement that can never run inside a migration's transaction, or that would touch the
    /// daemon's own bookkeeping.
    case forbiddenStatement(file: String, statement: String, reason: String)
    /// A statement without its terminating `;` (or with an unclosed string, comment or trigger body).
    case incompleteStatement(file: String, text: String)
    /// An unknown or malformed `-- userstore:` directive.
    case badDirective(file: String, line: String, message: String)
    /// A migration marked `-- Compatible` that changes more than it adds.
    case notCompatible(file: String, statement: String, reason: String)

    /// The file this problem is about (the first, for duplicates).
    public var file: String {
        switch self {
        case .unreadableDirectory(let path, _): return path
        case .malformedFileName(let file), .versionOutOfRange(let file), .unreadableFile(let file, _),
             .textBeforeFirstSection(let file), .repeatedSection(let file, _), .missingUp(let file),
             .forbiddenStatement(let file, _, _), .incompleteStatement(let file, _), .badDirective(let file, _, _),
             .notCompatible(let file, _, _):
            return file
        case .duplicateVersion(_, let files): return files.first ?? ""
        }
    }

    public var description: String {
        switch self {
        case .unreadableDirectory(let path, let message):
            return "\(path): cannot read migrations directory: \(message)"
        case .malformedFileName(let file):
            return "\(file): name must be NNNN_name.sql or NNNN-name.sql (a version number, then _ or -)"
        case .versionOutOfRange(let file):
            return "\(file): version must be between 1 and \(Int32.max)"
        case .duplicateVersion(let version, let files):
            return "version \(version) is used by more than one file: \(files.joined(separator: ", "))"
        case .unreadableFile(let file, let message):
            return "\(file): cannot read: \(message)"
        case .textBeforeFirstSection(let file):
            return "\(file): SQL before the first '-- Up' or '-- Down' marker"
        case .repeatedSection(let file, let section):
            return "\(file): section '-- \(section)' appears more than once"
        case .missingUp(let file):
            return "\(file): the Up section has no statement"
        case .forbiddenStatement(let file, let statement, let reason):
            return "\(file): '\(statement)' is not allowed in a migration: \(reason)"
        case .incompleteStatement(let file, let text):
            let excerpt = text.trimmingWhitespace().prefix(60)
            return "\(file): statement is not terminated (missing ';' or unclosed quote, comment or trigger body): \(excerpt)"
        case .badDirective(let file, let line, let message):
            return "\(file): directive '\(line.trimmingWhitespace())': \(message)"
        case .notCompatible(let file, let statement, let reason):
            return "\(file): marked '-- Compatible' but '\(statement)' is not an additive change: \(reason)"
        }
    }
}

/// The migrations directory cannot be used; `problems` lists every reason, each naming its file.
public struct MigrationSetError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Every problem found, in file-name order.
    public let problems: [MigrationProblem]

    public init(problems: [MigrationProblem]) { self.problems = problems }

    public var description: String {
        "invalid migrations (\(problems.count) problem\(problems.count == 1 ? "" : "s")):\n"
            + problems.map { "  " + $0.description }.joined(separator: "\n")
    }
}

extension StringProtocol {
    /// The text without leading and trailing spaces, tabs and newlines.
    func trimmingWhitespace() -> String {
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, first.properties.isWhitespace { scalars = scalars.dropFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars = scalars.dropLast() }
        return String(String.UnicodeScalarView(scalars))
    }
}
