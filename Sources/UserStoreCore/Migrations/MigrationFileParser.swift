/// Turns the text of one migration file into a ``Migration``.
///
/// File format (all parts optional except some SQL):
/// ```sql
/// -- userstore:app-version-below 2.0   (directive: run only on stores last opened by an app < 2.0)
/// -- Compatible                         (older daemons may serve a store past it: additive only)
/// -- Up
/// CREATE TABLE notes (...);
/// -- Down
/// DROP TABLE notes;
/// ```
/// A file without markers is all Up. Markers are matched case-insensitively, and the markers of
/// goose (`-- +goose Up`), dbmate (`-- migrate:up`) and sql-migrate (`-- +migrate Up`) are accepted
/// too, so existing migration files run unchanged.
///
/// `BEGIN`/`COMMIT`/`END` and `PRAGMA foreign_keys` statements are dropped (and listed in
/// ``Migration/ignoredStatements``): every migration already runs in exactly one transaction with
/// foreign keys switched off before it and checked before commit. Statements that cannot run in a
/// transaction or would touch the bookkeeping are refused.
public enum MigrationFileParser {
    /// The `-- userstore:` directive that gates a migration on the recorded app version.
    public static let appVersionBelowDirective = "app-version-below"

    private enum Section: String { case up = "Up", down = "Down" }

    /// Parses the file `fileName` (version already taken from its name) with text `contents`.
    public static func parse(version: Int64, name: String, fileName: String, contents: String) throws(MigrationProblem) -> Migration {
        var header: [Substring] = []
        var upLines: [Substring] = []
        var downLines: [Substring] = []
        var directives: [String] = []
        var current: Section?
        var seen: Set<String> = []
        var appVersionBelow: AppVersion?
        var compatible = false

        // Swift treats CRLF as one Character, so endings are unified before splitting lines.
        let lines = MigrationChecksum.unifyLineEndings(contents).split(separator: "\n", omittingEmptySubsequences: false)
        let hasMarkers = lines.contains { marker(in: $0) != nil }
        if !hasMarkers { current = .up }

        for line in lines {
            if let section = marker(in: line) {
                guard seen.insert(section.rawValue).inserted else {
                    throw .repeatedSection(file: fileName, section: section.rawValue)
                }
                current = section
                continue
            }
            if CompatibleChange.isMarker(line) {
                compatible = true
                directives.append("compatible") // in the checksum: adding or removing it is a change
                continue
            }
            if let directive = directiveText(in: line) {
                directives.append(directive)
                appVersionBelow = try parseDirective(directive, line: String(line), file: fileName) ?? appVersionBelow
                continue
            }
            switch current {
            case nil: header.append(line)
            case .up: upLines.append(line)
            case .down: downLines.append(line)
            }
        }
        if SQLScript.firstKeyword(of: header.joined(separator: "\n")) != nil {
            throw .textBeforeFirstSection(file: fileName)
        }

        let upText = upLines.joined(separator: "\n")
        var ignored: [String] = []
        let up = try statements(of: upText, file: fileName, ignored: &ignored)
        guard !up.isEmpty else { throw .missingUp(file: fileName) }
        let down = seen.contains(Section.down.rawValue)
            ? try statements(of: downLines.joined(separator: "\n"), file: fileName, ignored: &ignored) : nil

        if compatible {
            for statement in up {
                if let reason = CompatibleChange.problem(with: statement) {
                    throw .notCompatible(file: fileName, statement: StatementPolicy.summary(of: statement), reason: reason)
                }
            }
        }
        var migration = Migration(
            version: version, name: name, fileName: fileName, up: up, down: down,
            checksum: MigrationChecksum.of(upSection: upText, directives: directives),
            appVersionBelow: appVersionBelow, ignoredStatements: ignored)
        migration.compatible = compatible
        return migration
    }

    /// The section a marker line opens, or nil when `line` is not a marker.
    private static func marker(in line: Substring) -> Section? {
        let text = line.trimmingWhitespace().lowercased()
        guard text.hasPrefix("--") else { return nil }
        var rest = text.dropFirst(2).trimmingWhitespace()
        for prefix in ["+goose ", "+migrate ", "migrate:"] where rest.hasPrefix(prefix) {
            rest = String(rest.dropFirst(prefix.count)).trimmingWhitespace()
        }
        switch rest {
        case "up": return .up
        case "down": return .down
        default: return nil
        }
    }

    /// The text after `-- userstore:` on a directive line, or nil.
    private static func directiveText(in line: Substring) -> String? {
        let text = line.trimmingWhitespace()
        guard text.hasPrefix("--") else { return nil }
        let rest = text.dropFirst(2).trimmingWhitespace()
        guard rest.lowercased().hasPrefix("userstore:") else { return nil }
        return rest.dropFirst("userstore:".count).trimmingWhitespace()
    }

    private static func parseDirective(_ directive: String, line: String, file: String) throws(MigrationProblem) -> AppVersion? {
        let words = directive.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard let keyword = words.first?.lowercased() else {
            throw .badDirective(file: file, line: line, message: "empty directive")
        }
        guard keyword == appVersionBelowDirective else {
            throw .badDirective(file: file, line: line, message: "unknown directive '\(keyword)'; known: \(appVersionBelowDirective) VERSION")
        }
        guard words.count == 2 else {
            throw .badDirective(file: file, line: line, message: "expected exactly one version, e.g. '-- userstore:\(appVersionBelowDirective) 2.0'")
        }
        do {
            return try AppVersion(String(words[1]))
        } catch {
            throw .badDirective(file: file, line: line, message: error.description)
        }
    }

    /// Splits a section into statements, dropping the ones the engine owns and refusing the
    /// ones that cannot run inside a migration.
    private static func statements(of text: String, file: String, ignored: inout [String]) throws(MigrationProblem) -> [String] {
        let script = SQLScript(text)
        if let tail = script.incompleteTail { throw .incompleteStatement(file: file, text: tail) }
        var kept: [String] = []
        for statement in script.statements {
            switch StatementPolicy.classify(statement) {
            case .run: kept.append(statement.trimmingWhitespace())
            case .ignore: ignored.append(statement.trimmingWhitespace())
            case .refuse(let reason):
                throw .forbiddenStatement(file: file, statement: StatementPolicy.summary(of: statement), reason: reason)
            }
        }
        return kept
    }
}
