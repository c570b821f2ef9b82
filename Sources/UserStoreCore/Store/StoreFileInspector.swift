import Foundation
import GRDB

/// Reads facts about a store file without opening it as a store.
public enum StoreFileInspector {
    /// The schema version in a store file's header (`user_version`, offset 60): a 100-byte
    /// read, so listing 100,000 stores is cheap. A non-empty WAL (left by a crash) may hold a
    /// newer header, so SQLite reads it then. -1 when the file is not a readable store.
    /// Opens a second connection for that: use it only where nothing else has the file open
    /// (offline); the daemon uses ``headerVersion(of:)``.
    public static func schemaVersion(of path: String) -> Int64 {
        if let version = headerVersion(of: path) { return version }
        return (try? DatabaseQueue(path: path).read { try Int64.fetchOne($0, sql: "PRAGMA user_version") ?? -1 }) ?? -1
    }

    /// The schema version in a store file's header, or nil when a non-empty WAL (left by a
    /// crash) may hold a newer one and only SQLite can tell. -1 when the file is not a readable
    /// store.
    public static func headerVersion(of path: String) -> Int64? {
        if let size = (try? FileManager.default.attributesOfItem(atPath: path + "-wal"))?[.size] as? Int, size > 0 { return nil }
        guard let handle = FileHandle(forReadingAtPath: path) else { return -1 }
        defer { try? handle.close() }
        guard let header = try? handle.read(upToCount: 100) else { return -1 }
        if header.isEmpty { return 0 } // created, nothing written yet
        guard header.count == 100, header.starts(with: Array("SQLite format 3\u{0}".utf8)) else { return -1 }
        return header[header.startIndex + 60..<header.startIndex + 64].reduce(Int64(0)) { $0 << 8 | Int64($1) }
    }
}
