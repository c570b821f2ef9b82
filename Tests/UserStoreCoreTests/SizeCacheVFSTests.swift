import CSQLiteSizeCache
import Foundation
import GRDB
import GRDBSQLite
import Testing
@testable import UserStoreCore

/// The VFS layer the daemon registers (CSQLiteSizeCache): it keeps a database's size while the
/// file's EXCLUSIVE lock is held. Whatever it reports must be the file's real size, through
/// growth (checkpoints writing into the file), truncation (VACUUM) and rollback journals, and
/// the data must come back intact.
struct SizeCacheVFSTests {
    struct Failure: Error {}

    /// A connection through the layer, locked exclusively as the daemon's stores are (StoreOpener).
    static func open(_ path: String, journal: String) throws -> DatabaseQueue {
        #expect(userstore_register_size_cache_vfs() == SQLITE_OK)
        var configuration = Configuration()
        configuration.journalMode = .default
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = \(journal); PRAGMA synchronous = FULL")
        }
        return try DatabaseQueue(path: path, configuration: configuration)
    }

    /// The size the main database's file object (the layer's) reports.
    static func reportedSize(_ db: Database) throws -> Int64 {
        var file: UnsafeMutablePointer<sqlite3_file>?
        guard sqlite3_file_control(db.sqliteConnection, "main", SQLITE_FCNTL_FILE_POINTER, &file) == SQLITE_OK, let file,
              let methods = file.pointee.pMethods else { throw Failure() }
        var size: sqlite3_int64 = 0
        guard methods.pointee.xFileSize(file, &size) == SQLITE_OK else { throw Failure() }
        return size
    }

    /// The file's size on disk.
    static func realSize(_ path: String) throws -> Int64 {
        (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value ?? -1
    }

    /// The layer reports the real size, asked twice (the second answer is the kept one, under the lock).
    static func expectSizeRight(_ db: Database, _ path: String, _ when: String) throws {
        let real = try realSize(path)
        #expect(try reportedSize(db) == real, "\(when): the first answer is not the file's size")
        #expect(try reportedSize(db) == real, "\(when): the kept size is not the file's size")
    }

    static func pages(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db, sql: "PRAGMA page_count")! * Int64.fetchOne(db, sql: "PRAGMA page_size")!
    }

    /// The default VFS is the encrypting layer (CSQLiteCipher, which passes plaintext files
    /// through), over this one, over SQLite's own.
    @Test func theDefaultVFSIsTheLayer() throws {
        #expect(SQLiteProcessSettings.apply() || PageCipher.layerRegistered)
        #expect(sqlite3_vfs_find("userstore-size-cache") != nil)
        #expect(String(cString: sqlite3_vfs_find(nil).pointee.zName) == "userstore-cipher")
    }

    @Test(arguments: ["WAL", "DELETE"])
    func theSizeKeptUnderTheLockIsTheFileSizeThroughGrowthAndTruncation(journal: String) throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite"
        try Self.open(path, journal: journal).inDatabase { db in
            let checkpoint = { if journal == "WAL" { try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") } }
            try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, x BLOB NOT NULL)")
            #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM t") == 0)
            try Self.expectSizeRight(db, path, "created")

            // Growth: 3,000 rows of 400 bytes, checkpointed into the file.
            try db.execute(sql: """
                WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3000)
                INSERT INTO t (id, x) SELECT n, zeroblob(400) FROM c
                """)
            try checkpoint()
            try Self.expectSizeRight(db, path, "grown")
            #expect(try Self.pages(db) == Self.realSize(path))

            // Truncation: most rows deleted, the file rebuilt smaller.
            try db.execute(sql: "DELETE FROM t WHERE id > 100")
            try db.execute(sql: "VACUUM")
            try checkpoint()
            try Self.expectSizeRight(db, path, "vacuumed")
            #expect(try Self.pages(db) == Self.realSize(path))

            // Growth again after the truncation, then everything read back.
            try db.execute(sql: "INSERT INTO t (id, x) SELECT id + 5000, x FROM t")
            try checkpoint()
            try Self.expectSizeRight(db, path, "grown again")
            #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM t") == 200)
            #expect(try String.fetchOne(db, sql: "PRAGMA integrity_check") == "ok")
        }
    }

    @Test func aStoreOpenedAgainWithAnEmptyWALReadsEverything() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite"
        let writer = try Self.open(path, journal: "WAL")
        try writer.inDatabase { db in
            try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, x BLOB NOT NULL)")
            try db.execute(sql: """
                WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000)
                INSERT INTO t (id, x) SELECT n, zeroblob(300) FROM c
                """)
        }
        try writer.close() // checkpointed, the WAL removed
        try Self.open(path, journal: "WAL").inDatabase { db in
            // Read transactions on an empty WAL: the database's size comes from the layer each time.
            for _ in 0..<3 { #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM t") == 2000) }
            try Self.expectSizeRight(db, path, "read, WAL empty")
            #expect(try String.fetchOne(db, sql: "PRAGMA integrity_check") == "ok")
        }
    }
}
