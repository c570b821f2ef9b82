import Foundation
import GRDB
import UserStoreCore

/// One finding of `userstorectl migrations check`.
public struct LintFinding: Sendable, Equatable, CustomStringConvertible {
    public enum Severity: String, Sendable { case error, warning, note }
    public var severity: Severity
    public var file: String
    public var message: String

    public var description: String { "\(file): \(severity.rawValue): \(message)" }
}

/// Checks a migrations directory without a daemon or a store: what the loader refuses
/// (duplicate or malformed versions, a missing Up, statements that cannot run in a
/// transaction, unterminated statements), names that do not sort in version order,
/// destructive statements, and every statement compiled and run against a scratch database
/// built from the earlier migrations (each Down checked against the schema its Up produced).
public struct MigrationLinter {
    /// Do not report DROP TABLE / DROP COLUMN.
    public var allowDestructive: Bool

    public init(allowDestructive: Bool = false) {
        self.allowDestructive = allowDestructive
    }

    public func check(directory: String) -> [LintFinding] {
        var findings: [LintFinding] = []
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".sql") && !$0.hasPrefix(".") }.sorted()
        } catch {
            return [LintFinding(severity: .error, file: directory, message: "cannot read the directory: \((error as NSError).localizedDescription)")]
        }
        var migrations: [Migration] = []
        var filesByVersion: [Int64: [String]] = [:]
        for name in names {
            do throws(MigrationProblem) {
                let (version, label) = try MigrationSet.parseFileName(name)
                filesByVersion[version, default: []].append(name)
                guard let text = try? String(contentsOfFile: directory + "/" + name, encoding: .utf8) else {
                    throw .unreadableFile(file: name, message: "unreadable or not UTF-8")
                }
                migrations.append(try MigrationFileParser.parse(version: version, name: label, fileName: name, contents: text))
            } catch {
                findings.append(LintFinding(severity: .error, file: error.file, message: Self.strip(error.description, file: error.file)))
            }
        }
        for (version, files) in filesByVersion.sorted(by: { $0.key < $1.key }) where files.count > 1 {
            findings.append(LintFinding(severity: .error, file: files[0], message: "duplicate version \(version): also used by \(files.dropFirst().joined(separator: ", "))"))
        }
        let byVersion = migrations.sorted { $0.version < $1.version }
        if byVersion.map(\.fileName) != migrations.map(\.fileName) {
            let first = zip(byVersion, migrations).first { $0.fileName != $1.fileName }!
            findings.append(LintFinding(severity: .warning, file: first.1.fileName,
                                        message: "file names do not sort in version order (\(first.1.fileName) sorts before \(first.0.fileName)): pad the numbers with zeros"))
        }
        var seen = Set<Int64>()
        let unique = byVersion.filter { seen.insert($0.version).inserted }
        for migration in unique {
            for statement in migration.ignoredStatements {
                findings.append(LintFinding(severity: .note, file: migration.fileName,
                                            message: "'\(SQLScript.excerpt(of: statement))' is ignored: every migration runs in one transaction with foreign keys handled by userstored"))
            }
            if !allowDestructive { findings += destructive(migration) }
            if let loss = migration.dataLossReason {
                let why = loss.hasPrefix(migration.fileName + ": ") ? String(loss.dropFirst(migration.fileName.count + 2)) : loss
                findings.append(LintFinding(severity: .note, file: migration.fileName,
                                            message: "with backupBeforeMigrating: auto, stores are copied before this migration: \(why)"))
            }
        }
        findings += compile(unique)
        return findings
    }

    /// DROP TABLE (except the drop of a table rebuilt under the same name) and DROP COLUMN in Up.
    private func destructive(_ migration: Migration) -> [LintFinding] {
        var findings: [LintFinding] = []
        let renamedTo = Set(migration.up.compactMap { statement -> String? in
            let words = SQLScript.keywords(of: statement, count: 6)
            guard words.count == 6, words[0] == "ALTER", words[1] == "TABLE", words[3] == "RENAME", words[4] == "TO" else { return nil }
            return words[5]
        })
        for statement in migration.up {
            let words = SQLScript.keywords(of: statement, count: 7)
            if words.starts(with: ["DROP", "TABLE"]) {
                let table = words.count > 4 && words[2] == "IF" ? words[4] : (words.count > 2 ? words[2] : "?")
                if renamedTo.contains(table) { continue } // SQLite's table rebuild: the data moved to the new table
                findings.append(LintFinding(severity: .warning, file: migration.fileName, message: "destructive: '\(SQLScript.excerpt(of: statement))' drops table \(table.lowercased()) and its data"))
            } else if words.count >= 5, words[0] == "ALTER", words[1] == "TABLE", words[3] == "DROP" {
                let column = words[4] == "COLUMN" && words.count > 5 ? words[5] : words[4]
                findings.append(LintFinding(severity: .warning, file: migration.fileName, message: "destructive: '\(SQLScript.excerpt(of: statement))' drops column \(column.lowercased()) and its data"))
            }
        }
        return findings
    }

    /// Runs every migration in version order on an in-memory database, as the engine would.
    private func compile(_ migrations: [Migration]) -> [LintFinding] {
        var findings: [LintFinding] = []
        guard let queue = try? DatabaseQueue() else { return [] }
        try? queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA foreign_keys = OFF")
            for migration in migrations {
                var failed = false
                for (index, statement) in migration.up.enumerated() {
                    do {
                        try db.execute(sql: statement)
                    } catch let error as DatabaseError {
                        findings.append(LintFinding(severity: .error, file: migration.fileName,
                                                    message: "Up statement \(index + 1) ('\(SQLScript.excerpt(of: statement))'): \(error.message ?? "\(error.resultCode)")"))
                        failed = true
                        break
                    }
                }
                guard !failed, let down = migration.down, !down.isEmpty else { continue }
                // The Down must run against the schema its Up produced; undone right after.
                try db.execute(sql: "SAVEPOINT lint_down")
                for (index, statement) in down.enumerated() {
                    do {
                        try db.execute(sql: statement)
                    } catch let error as DatabaseError {
                        findings.append(LintFinding(severity: .error, file: migration.fileName,
                                                    message: "Down statement \(index + 1) ('\(SQLScript.excerpt(of: statement))'): \(error.message ?? "\(error.resultCode)")"))
                        break
                    }
                }
                try db.execute(sql: "ROLLBACK TO lint_down")
                try db.execute(sql: "RELEASE lint_down")
            }
        }
        return findings
    }

    private static func strip(_ text: String, file: String) -> String {
        text.hasPrefix(file + ": ") ? String(text.dropFirst(file.count + 2)) : text
    }
}
