import CSQLiteSettings
import Foundation
import GRDB

/// Reads facts about a store file without opening it as a store.
public enum StoreFileInspector {
    /// The schema version in a store file's header (`user_version`, offset 60): a 100-byte
    /// read, so listing 100,000 stores is cheap. A non-empty WAL (left by a crash) may hold a
    /// newer header, so SQLite reads it then (``versionReadingWAL(of:)``: the WAL is left as it
    /// is). -1 when the file is not a readable store. Opens a second connection for that: use
    /// it only where nothing else has the file open (offline); the daemon uses
    /// ``headerVersion(of:)``.
    /// An encrypted store's WAL is read with `cipher` (its user's; without it, -1), asked for
    /// only then: fetching a key may be a request to the key store.
    public static func schemaVersion(of path: String, cipher: @autoclosure () -> PageCipher? = nil) -> Int64 {
        headerVersion(of: path) ?? versionReadingWAL(of: path, cipher: cipher())
    }

    /// The schema version in a store file's header, or nil when a non-empty WAL (left by a
    /// crash) may hold a newer one and only SQLite can tell. -1 when the file is not a readable
    /// store.
    public static func headerVersion(of path: String) -> Int64? {
        header(of: path).version
    }

    /// ``headerVersion(of:)``, and whether the file is an encrypted store's, from one read.
    public static func header(of path: String) -> (version: Int64?, encrypted: Bool) {
        guard let head = FileHead(path: path, count: 100) else { return (-1, false) }
        let header = head.bytes
        let encrypted = header.starts(with: PageCipher.storedMagic)
        if let size = FileHead.size(of: path + "-wal"), size > 0 { return (nil, encrypted) }
        if header.isEmpty { return (0, false) } // created, nothing written yet
        guard header.count == 100, hasStoreMagic(header) else { return (-1, false) }
        return (header[60..<64].reduce(Int64(0)) { $0 << 8 | Int64($1) }, encrypted)
    }

    /// The schema version as SQLite reads it, WAL included, through a read-only connection
    /// that leaves the WAL as it is when it closes (a restored copy, an offline store: nothing
    /// else has the file open). -1 when the file cannot be read.
    /// An encrypted store is read with `cipher` (its user's).
    public static func versionReadingWAL(of path: String, cipher: PageCipher? = nil) -> Int64 {
        var configuration = Configuration()
        configuration.readonly = true
        configuration.prepareDatabase { db in
            try cipher?.install(on: db.sqliteConnection!)
            _ = userstore_keep_wal_on_close(db.sqliteConnection)
        }
        return (try? DatabaseQueue(path: path, configuration: configuration).read { try Int64.fetchOne($0, sql: "PRAGMA user_version") ?? -1 }) ?? -1
    }

    /// Whether `header` starts as a store's file does: SQLite's magic, or an encrypted store's
    /// (``PageCipher``: the rest of its 100-byte header is SQLite's, in plaintext).
    static func hasStoreMagic(_ header: [UInt8]) -> Bool {
        header.starts(with: PageCipher.sqliteMagic) || header.starts(with: PageCipher.storedMagic)
    }

    /// Whether the file at `path` is an encrypted store (its first bytes say so); false for a
    /// plaintext one, an empty one, or no file.
    public static func isEncrypted(_ path: String) -> Bool {
        FileHead(path: path, count: 16)?.bytes.starts(with: PageCipher.storedMagic) ?? false
    }
}

extension StoreFileInspector {
    /// Why the file at `path` (and its WAL) cannot be a sound store, read from the headers
    /// before SQLite opens it; nil when nothing is visibly wrong. Opening a damaged file could
    /// change it (SQLite checkpoints and deletes a WAL it ignores), and the daemon never changes
    /// a damaged store on its own.
    ///
    /// Checks: the 100-byte header (magic, page size), a file shorter than the header's page
    /// count says (truncated), and a WAL whose 32-byte header is not a WAL header (magic,
    /// format, page size, checksum). Damage inside a page is found when SQLite reads it.
    /// SQLite's `quick_check` of the database at `path` (opened read-only); nil when it is sound,
    /// else what it found.
    /// An encrypted store's file is read with `cipher` (its user's).
    public static func quickCheck(_ path: String, cipher: PageCipher? = nil) -> String? {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READONLY, nil) == SQLITE_OK, let connection else {
            return "it cannot be opened"
        }
        if let cipher {
            do { try cipher.install(on: connection) } catch { return "it cannot be decrypted: \(error)" }
        }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(connection, "PRAGMA quick_check", -1, &statement, nil) == SQLITE_OK,
              sqlite3_step(statement) == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) else {
            return String(cString: sqlite3_errmsg(connection))
        }
        let finding = String(cString: text)
        return finding == "ok" ? nil : finding
    }

    public static func damage(of path: String) -> String? {
        inspect(path).damage
    }

    /// ``damage(of:)`` and whether the file is an encrypted store's, from one read of its header.
    public static func inspect(_ path: String) -> (damage: String?, encrypted: Bool) {
        guard let head = FileHead(path: path, count: 100) else { return (nil, false) }
        return (damage(head, path: path), head.bytes.starts(with: PageCipher.storedMagic))
    }

    private static func damage(_ head: FileHead, path: String) -> String? {
        let size = head.size, bytes = head.bytes
        guard size > 0 else { return nil } // created, nothing written yet
        guard bytes.count == 100 else { return "truncated: \(size) bytes, shorter than the 100-byte header" }
        guard hasStoreMagic(bytes) else { return "not a SQLite database (no SQLite header)" }
        func be32(_ offset: Int) -> UInt32 { bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let rawPageSize = Int(bytes[16]) << 8 | Int(bytes[17])
        let pageSize = rawPageSize == 1 ? 65_536 : rawPageSize
        guard pageSize >= 512, pageSize <= 65_536, pageSize & (pageSize - 1) == 0 else { return "the header's page size \(rawPageSize) is not valid" }
        // The in-header size counts only when the change counter matches "version-valid-for".
        if be32(24) == be32(92), be32(28) > 0 {
            let expected = UInt64(be32(28)) * UInt64(pageSize)
            if size < expected { return "truncated: \(size) bytes, the header says \(be32(28)) pages of \(pageSize) bytes" }
        }
        return walDamage(path + "-wal", pageSize: pageSize)
    }

    /// Why a non-empty WAL is not one (see ``damage(of:)``).
    static func walDamage(_ path: String, pageSize: Int) -> String? {
        guard let bytes = FileHead(path: path, count: 32)?.bytes, !bytes.isEmpty else { return nil }
        guard bytes.count == 32 else { return "the WAL is shorter than its 32-byte header" }
        func be32(_ offset: Int) -> UInt32 { bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let magic = be32(0)
        guard magic == 0x377F_0682 || magic == 0x377F_0683 else { return "the WAL is not a WAL (bad magic number)" }
        guard be32(4) == 3_007_000 else { return "the WAL's format version \(be32(4)) is unknown" }
        guard Int(be32(8)) == pageSize || (pageSize == 65_536 && be32(8) == 1) else { return "the WAL's page size \(be32(8)) differs from the database's \(pageSize)" }
        // SQLite's checksum over the first 24 bytes, in the byte order the magic number says.
        let bigEndian = magic & 1 == 1
        var s0: UInt32 = 0, s1: UInt32 = 0
        for offset in stride(from: 0, to: 24, by: 8) {
            func word(_ at: Int) -> UInt32 {
                bigEndian ? be32(at) : bytes[at..<at + 4].reversed().reduce(0) { $0 << 8 | UInt32($1) }
            }
            s0 = s0 &+ word(offset) &+ s1
            s1 = s1 &+ word(offset + 4) &+ s0
        }
        guard s0 == be32(24), s1 == be32(28) else { return "the WAL's header checksum does not match (garbage over the WAL)" }
        return nil
    }
}
