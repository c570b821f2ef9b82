import Foundation
import GRDB
import GRDBSQLite

/// Takes consistent copies of stores (SQLite's online backup API) and prunes old ones.
///
/// Copies live in `<data>/backups/ab/cd/<user>.v<schemaVersion>.<UTC time>.sqlite`.
struct BackupKeeper: Sendable {
    let layout: StoreLayout

    /// Copies the store open on `db` and returns the copy's path. Runs outside any transaction.
    ///
    /// The copy is written page by page to `<path>.partial` without a journal (nobody else can
    /// see it), then published with ``DurableFile``: a crash leaves either no copy or a complete
    /// one, and it is on disk before the migration it protects commits. Cheaper than `VACUUM
    /// INTO`, which re-parses the schema, rebuilds every table and index, and writes, syncs and
    /// deletes a journal.
    func take(_ db: Database, user: UserID, schemaVersion: Int64, to explicitPath: String? = nil) throws -> String {
        let path: String
        if let explicitPath {
            path = explicitPath
        } else {
            let directory = layout.backupDirectory(for: user)
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            path = directory + "/" + Self.fileName(user: user, schemaVersion: schemaVersion, at: Date())
        }
        let partial = path + Self.partialSuffix
        do {
            try Self.copy(db.sqliteConnection!, to: partial)
            try DurableFile.publish(partial, as: path)
        } catch {
            unlink(partial)
            throw StoreError.storageFailure(user: user, message: "backup to \(path) failed: \(error)")
        }
        return path
    }

    /// Suffix of a copy still being written (or left by a crash; ``prune(user:olderThanSeconds:)`` removes those).
    static let partialSuffix = ".partial"

    private struct CopyFailure: Error, CustomStringConvertible { let description: String }

    /// Copies every page of `source`'s main database into a new file at `path`.
    private static func copy(_ source: OpaquePointer, to path: String) throws {
        var destination: OpaquePointer?
        defer { sqlite3_close_v2(destination) }
        guard sqlite3_open_v2(path, &destination, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let destination else {
            throw CopyFailure(description: destination.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory")
        }
        func failure() -> CopyFailure { CopyFailure(description: String(cString: sqlite3_errmsg(destination))) }
        // The copy is private until published: no journal, and one sync of the whole file then.
        guard sqlite3_exec(destination, "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF", nil, nil, nil) == SQLITE_OK else { throw failure() }
        guard let backup = sqlite3_backup_init(destination, "main", source, "main") else { throw failure() }
        let stepped = sqlite3_backup_step(backup, -1)
        guard sqlite3_backup_finish(backup) == SQLITE_OK, stepped == SQLITE_DONE else { throw failure() }
    }

    /// Deletes `user`'s copies older than `seconds`, and any copy a crash left half-written.
    func prune(user: UserID, olderThanSeconds seconds: Int) {
        let directory = layout.backupDirectory(for: user)
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        let cutoff = Date().addingTimeInterval(-Double(seconds))
        for name in names {
            let path = directory + "/" + name
            if name.hasSuffix(Self.partialSuffix), Self.isBackup(String(name.dropLast(Self.partialSuffix.count)), of: user) {
                // Only this store's queue writes its copies, and it is here: this one is left over.
                unlink(path)
                continue
            }
            guard Self.isBackup(name, of: user) else { continue }
            let modified = (try? FileManager.default.attributesOfItem(atPath: path)[.modificationDate] as? Date) ?? Date()
            if seconds <= 0 || modified < cutoff { try? FileManager.default.removeItem(atPath: path) }
        }
    }

    /// Every backup of `user`, oldest first.
    func list(user: UserID) -> [String] {
        let directory = layout.backupDirectory(for: user)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.filter { Self.isBackup($0, of: user) }.sorted().map { directory + "/" + $0 }
    }

    /// `<user>.v<schemaVersion>.<yyyyMMdd'T'HHmmss.ffffff'Z'>.sqlite` (UTC; names sort by time).
    static func fileName(user: UserID, schemaVersion: Int64, at date: Date) -> String {
        let since1970 = date.timeIntervalSince1970
        var seconds = time_t(since1970.rounded(.down))
        var utc = tm()
        gmtime_r(&seconds, &utc)
        let stamp = String(format: "%04d%02d%02dT%02d%02d%02d.%06dZ", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                           utc.tm_hour, utc.tm_min, utc.tm_sec, Int32((since1970 - Double(seconds)) * 1_000_000))
        return "\(user.rawValue).v\(schemaVersion).\(stamp).sqlite"
    }

    /// Whether `name` is one of `user`'s copies (and not the copy of a user whose ID merely
    /// starts with the same characters).
    static func isBackup(_ name: String, of user: UserID) -> Bool {
        let prefix = user.rawValue + ".v"
        guard name.hasPrefix(prefix), name.hasSuffix(".sqlite") else { return false }
        let middle = name.dropFirst(prefix.count).dropLast(".sqlite".count)
        let parts = middle.split(separator: ".", maxSplits: 1)
        guard parts.count == 2, parts[0].allSatisfy(\.isNumber) else { return false }
        return parts[1].allSatisfy { $0.isNumber || $0 == "T" || $0 == "Z" || $0 == "." }
    }
}
