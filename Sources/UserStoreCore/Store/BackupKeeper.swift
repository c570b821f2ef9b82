import Foundation
import GRDB

/// Takes consistent copies of stores (`VACUUM INTO`) and prunes old ones.
///
/// Copies live in `<data>/backups/ab/cd/<user>.v<schemaVersion>.<UTC time>.sqlite`.
struct BackupKeeper: Sendable {
    let layout: StoreLayout

    /// Copies the store open on `db` and returns the copy's path. Runs outside any transaction.
    func take(_ db: Database, user: UserID, schemaVersion: Int64, to explicitPath: String? = nil) throws -> String {
        let path: String
        if let explicitPath {
            path = explicitPath
        } else {
            let directory = layout.backupDirectory(for: user)
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            path = directory + "/" + Self.fileName(user: user, schemaVersion: schemaVersion, at: Date())
        }
        do {
            try db.execute(sql: "VACUUM INTO ?", arguments: [path])
        } catch let error as DatabaseError {
            throw StoreError.storageFailure(user: user, message: "backup to \(path) failed: \(error.message ?? "\(error.resultCode)")")
        }
        return path
    }

    /// Deletes `user`'s copies older than `seconds`.
    func prune(user: UserID, olderThanSeconds seconds: Int) {
        let directory = layout.backupDirectory(for: user)
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        let cutoff = Date().addingTimeInterval(-Double(seconds))
        for name in names where Self.isBackup(name, of: user) {
            let path = directory + "/" + name
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

    static func fileName(user: UserID, schemaVersion: Int64, at date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMdd'T'HHmmss.SSSSSS'Z'"
        return "\(user.rawValue).v\(schemaVersion).\(formatter.string(from: date)).sqlite"
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
