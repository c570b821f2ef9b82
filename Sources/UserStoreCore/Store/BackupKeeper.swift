import Foundation
import GRDB
import GRDBSQLite

/// Why a copy of a store was taken.
public enum BackupReason: String, Sendable, CaseIterable {
    /// Before a migration (kept for `migrations.backupRetentionSeconds`).
    case beforeMigration = "before-migration"
    /// `io.userstore.Admin.Backup` into the backups folder (kept until deleted).
    case manual
    /// The live store, before `RestoreStore` replaced it.
    case beforeRestore = "before-restore"
    /// The live store, before `ImportStore` with `replace` replaced it.
    case beforeImport = "before-import"
}

/// One copy of a store in the backups folder.
public struct BackupInfo: Sendable, Equatable {
    public var path: String
    /// The file's name (what `RestoreStore` accepts, as well as the path).
    public var fileName: String
    /// When it was taken (ISO-8601 UTC, microseconds).
    public var takenAt: String
    /// The store's schema version when it was taken.
    public var schemaVersion: Int64
    public var reason: BackupReason
    public var bytes: Int64
}

/// Takes consistent copies of stores (SQLite's online backup API), lists and prunes them.
///
/// Copies live in `<data>/backups/ab/<user>.v<schemaVersion>.<UTC time>.<reason>.sqlite`;
/// those earlier versions kept in `backups/ab/cd/`, and names without `.<reason>` (read as
/// before-migration), are still found.
struct BackupKeeper: Sendable {
    let layout: StoreLayout

    /// Copies the store open on `db` and returns the copy's path. Runs outside any transaction.
    ///
    /// The copy is written page by page to `<path>.partial` without a journal (nobody else can
    /// see it), then published with ``DurableFile``: a crash leaves either no copy or a complete
    /// one, and it is on disk before the migration it protects commits. Cheaper than `VACUUM
    /// INTO`, which re-parses the schema, rebuilds every table and index, and writes, syncs and
    /// deletes a journal.
    func take(_ db: Database, user: UserID, schemaVersion: Int64, reason: BackupReason, to explicitPath: String? = nil) throws -> String {
        try take(db.sqliteConnection!, user: user, schemaVersion: schemaVersion, reason: reason, to: explicitPath)
    }

    /// ``take(_:user:schemaVersion:reason:to:)`` from a raw connection.
    func take(_ connection: OpaquePointer, user: UserID, schemaVersion: Int64, reason: BackupReason, to explicitPath: String? = nil) throws -> String {
        let path: String
        if let explicitPath {
            path = explicitPath
        } else {
            let directory = layout.backupDirectory(for: user)
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            path = directory + "/" + Self.fileName(user: user, schemaVersion: schemaVersion, reason: reason, at: Date())
        }
        let partial = path + Self.partialSuffix
        do {
            try Self.copy(connection, to: partial)
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
    /// An encrypted store's copy is encrypted with the same key, unless `plaintext` (an export).
    static func copy(_ source: OpaquePointer, to path: String, plaintext: Bool = false) throws {
        var destination: OpaquePointer?
        defer { sqlite3_close_v2(destination) }
        guard sqlite3_open_v2(path, &destination, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let destination else {
            throw CopyFailure(description: destination.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory")
        }
        func failure() -> CopyFailure { CopyFailure(description: String(cString: sqlite3_errmsg(destination))) }
        // An encrypted store's copy is encrypted with the same key (the backup API hands over
        // the pages in plaintext).
        if !plaintext, let cipher = PageCipher.of(source) {
            do {
                try cipher.install(on: destination)
            } catch {
                throw CopyFailure(description: "the copy cannot be encrypted: \(error)")
            }
        }
        // The copy is private until published: no journal, and one sync of the whole file then.
        guard sqlite3_exec(destination, "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF", nil, nil, nil) == SQLITE_OK else { throw failure() }
        guard let backup = sqlite3_backup_init(destination, "main", source, "main") else { throw failure() }
        let stepped = sqlite3_backup_step(backup, -1)
        guard sqlite3_backup_finish(backup) == SQLITE_OK, stepped == SQLITE_DONE else { throw failure() }
    }

    /// Every file of `user` in its backup folders (``StoreLayout/backupDirectories(for:)``):
    /// the copies, and any `.partial` a crash left half-written (`name` without that suffix).
    /// The one listing behind pruning, listing and deleting a store.
    func files(of user: UserID) -> [(path: String, name: String, partial: Bool)] {
        layout.backupDirectories(for: user).flatMap { directory in
            // Most stores have no copies (every store a fleet run migrates without one looks):
            // a missing folder costs one stat here, not a thrown and discarded NSError.
            guard FileManager.default.fileExists(atPath: directory) else { return [(path: String, name: String, partial: Bool)]() }
            return ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted().compactMap { entry in
                let partial = entry.hasSuffix(Self.partialSuffix)
                let name = partial ? String(entry.dropLast(Self.partialSuffix.count)) : entry
                return Self.isBackup(name, of: user) ? (directory + "/" + entry, name, partial) : nil
            }
        }
    }

    /// Deletes `user`'s before-migration copies older than `seconds`, and any copy a crash left
    /// half-written. Copies an operator asked for (manual, before a restore or an import) stay.
    func prune(user: UserID, olderThanSeconds seconds: Int) {
        let cutoff = Date().addingTimeInterval(-Double(seconds))
        for file in files(of: user) {
            if file.partial {
                // Only this store's queue writes its copies, and it is here: this one is left over.
                unlink(file.path)
                continue
            }
            guard Self.parse(file.name, of: user)?.reason == .beforeMigration else { continue }
            let modified = (try? FileManager.default.attributesOfItem(atPath: file.path)[.modificationDate] as? Date) ?? Date()
            if seconds <= 0 || modified < cutoff { try? FileManager.default.removeItem(atPath: file.path) }
        }
    }

    /// Every backup of `user`, oldest first.
    func list(user: UserID) -> [String] {
        backups(of: user).map(\.path)
    }

    /// Every backup of `user` with what its name and size say, oldest first.
    func backups(of user: UserID) -> [BackupInfo] {
        files(of: user).compactMap { file -> BackupInfo? in
            guard !file.partial, let parsed = Self.parse(file.name, of: user) else { return nil }
            let bytes = (try? FileManager.default.attributesOfItem(atPath: file.path)[.size] as? Int64) ?? 0
            return BackupInfo(path: file.path, fileName: file.name, takenAt: parsed.takenAt, schemaVersion: parsed.schemaVersion, reason: parsed.reason, bytes: bytes)
        }.sorted { ($0.takenAt, $0.fileName) < ($1.takenAt, $1.fileName) }
    }

    /// `<user>.v<schemaVersion>.<yyyyMMdd'T'HHmmss.ffffff'Z'>.<reason>.sqlite` (UTC; names sort by time).
    static func fileName(user: UserID, schemaVersion: Int64, reason: BackupReason, at date: Date) -> String {
        let since1970 = date.timeIntervalSince1970
        var seconds = time_t(since1970.rounded(.down))
        var utc = tm()
        gmtime_r(&seconds, &utc)
        let stamp = String(format: "%04d%02d%02dT%02d%02d%02d.%06dZ", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                           utc.tm_hour, utc.tm_min, utc.tm_sec, Int32((since1970 - Double(seconds)) * 1_000_000))
        return "\(user.rawValue).v\(schemaVersion).\(stamp).\(reason.rawValue).sqlite"
    }

    /// Whether `name` is one of `user`'s copies (and not the copy of a user whose ID merely
    /// starts with the same characters).
    static func isBackup(_ name: String, of user: UserID) -> Bool { parse(name, of: user) != nil }

    /// What the name of one of `user`'s copies says; nil for any other name.
    static func parse(_ name: String, of user: UserID) -> (schemaVersion: Int64, takenAt: String, reason: BackupReason)? {
        let prefix = user.rawValue + ".v"
        guard name.hasPrefix(prefix), name.hasSuffix(".sqlite") else { return nil }
        // <version>.<yyyyMMdd>T<HHmmss>.<ffffff>Z[.<reason>]
        let parts = name.dropFirst(prefix.count).dropLast(".sqlite".count).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 || parts.count == 4, let version = Int64(parts[0]), parts[0].allSatisfy(\.isNumber) else { return nil }
        let (day, fraction) = (Array(parts[1].utf8), Array(parts[2].utf8))
        guard day.count == 15, day[8] == UInt8(ascii: "T"), fraction.count == 7, fraction[6] == UInt8(ascii: "Z"),
              day.enumerated().allSatisfy({ $0.offset == 8 || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0.element) }),
              fraction.dropLast().allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }) else { return nil }
        let reason: BackupReason
        if parts.count == 4 {
            guard let named = BackupReason(rawValue: String(parts[3])) else { return nil }
            reason = named
        } else {
            reason = .beforeMigration
        }
        let d = String(parts[1])
        func at(_ offset: Int, _ length: Int) -> Substring { d.dropFirst(offset).prefix(length) }
        let takenAt = "\(at(0, 4))-\(at(4, 2))-\(at(6, 2))T\(at(9, 2)):\(at(11, 2)):\(at(13, 2)).\(parts[2].dropLast())Z"
        return (version, takenAt, reason)
    }
}
