import CSQLiteSizeCache
import Foundation
import GRDBSQLite
import Testing
@testable import UserStoreCore

/// The VFS layer the daemon registers (CSQLiteSizeCache): it keeps a database's size while the
/// file's EXCLUSIVE lock is held. Whatever it reports must be the file's real size, through
/// growth (checkpoints writing into the file), truncation (VACUUM) and rollback journals, and
/// the data must come back intact.
struct SizeCacheVFSTests {
    struct Failure: Error, CustomStringConvertible { let description: String }

    /// A connection through the layer, locked exclusively as the daemon's stores are.
    final class Connection {
        var handle: OpaquePointer?
        let path: String

        init(_ path: String, journal: String) throws {
            self.path = path
            #expect(userstore_register_size_cache_vfs() == SQLITE_OK)
            guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK else {
                throw Failure(description: "open \(path)")
            }
            try run("PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = \(journal); PRAGMA synchronous = FULL")
        }
        deinit { sqlite3_close_v2(handle) }

        func run(_ sql: String) throws {
            guard sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK else {
                throw Failure(description: "\(sql): \(String(cString: sqlite3_errmsg(handle)))")
            }
        }

        func integer(_ sql: String) throws -> Int64 {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else { throw Failure(description: sql) }
            defer { sqlite3_finalize(statement) }
            guard sqlite3_step(statement) == SQLITE_ROW else { throw Failure(description: "\(sql): no row") }
            return sqlite3_column_int64(statement, 0)
        }

        func text(_ sql: String) throws -> String {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else { throw Failure(description: sql) }
            defer { sqlite3_finalize(statement) }
            guard sqlite3_step(statement) == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) else { throw Failure(description: sql) }
            return String(cString: text)
        }

        /// The size the main database's file object (the layer's) reports.
        func reportedSize() throws -> Int64 {
            var file: UnsafeMutablePointer<sqlite3_file>?
            guard sqlite3_file_control(handle, "main", SQLITE_FCNTL_FILE_POINTER, &file) == SQLITE_OK, let file,
                  let methods = file.pointee.pMethods else { throw Failure(description: "no file pointer") }
            var size: sqlite3_int64 = 0
            guard methods.pointee.xFileSize(file, &size) == SQLITE_OK else { throw Failure(description: "xFileSize") }
            return size
        }

        /// The file's size on disk.
        func realSize() throws -> Int64 {
            (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value ?? -1
        }

        /// Reports its real size, asked twice (the second answer is the kept one, under the lock).
        func expectSizeRight(_ when: String) throws {
            let real = try realSize()
            #expect(try reportedSize() == real, "\(when): the first answer is not the file's size")
            #expect(try reportedSize() == real, "\(when): the kept size is not the file's size")
        }
    }

    @Test func theDefaultVFSIsTheLayer() throws {
        #expect(userstore_register_size_cache_vfs() == SQLITE_OK)
        #expect(String(cString: sqlite3_vfs_find(nil).pointee.zName) == "userstore-size-cache")
    }

    @Test(arguments: ["WAL", "DELETE"])
    func theSizeKeptUnderTheLockIsTheFileSizeThroughGrowthAndTruncation(journal: String) throws {
        let directory = try TemporaryDirectory()
        let connection = try Connection(directory.path + "/store.sqlite", journal: journal)
        try connection.run("CREATE TABLE t (id INTEGER PRIMARY KEY, x BLOB NOT NULL)")
        #expect(try connection.integer("SELECT count(*) FROM t") == 0)
        try connection.expectSizeRight("created")

        // Growth: 3,000 rows of 400 bytes, checkpointed into the file.
        try connection.run("""
            WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3000)
            INSERT INTO t (id, x) SELECT n, zeroblob(400) FROM c
            """)
        if journal == "WAL" { try connection.run("PRAGMA wal_checkpoint(TRUNCATE)") }
        try connection.expectSizeRight("grown")
        #expect(try connection.integer("PRAGMA page_count") * connection.integer("PRAGMA page_size") == connection.realSize())

        // Truncation: most rows deleted, the file rebuilt smaller.
        try connection.run("DELETE FROM t WHERE id > 100")
        try connection.run("VACUUM")
        if journal == "WAL" { try connection.run("PRAGMA wal_checkpoint(TRUNCATE)") }
        try connection.expectSizeRight("vacuumed")
        #expect(try connection.integer("PRAGMA page_count") * connection.integer("PRAGMA page_size") == connection.realSize())

        // Growth again after the truncation, then everything read back.
        try connection.run("INSERT INTO t (id, x) SELECT id + 5000, x FROM t")
        if journal == "WAL" { try connection.run("PRAGMA wal_checkpoint(TRUNCATE)") }
        try connection.expectSizeRight("grown again")
        #expect(try connection.integer("SELECT count(*) FROM t") == 200)
        #expect(try connection.text("PRAGMA integrity_check") == "ok")
    }

    @Test func aStoreOpenedAgainWithAnEmptyWALReadsEverything() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite"
        do {
            let writer = try Connection(path, journal: "WAL")
            try writer.run("CREATE TABLE t (id INTEGER PRIMARY KEY, x BLOB NOT NULL)")
            try writer.run("""
                WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000)
                INSERT INTO t (id, x) SELECT n, zeroblob(300) FROM c
                """)
        } // closed: checkpointed, the WAL removed
        let reader = try Connection(path, journal: "WAL")
        // Read transactions on an empty WAL: the database's size comes from the layer each time.
        for _ in 0..<3 { #expect(try reader.integer("SELECT count(*) FROM t") == 2000) }
        try reader.expectSizeRight("read, WAL empty")
        #expect(try reader.text("PRAGMA integrity_check") == "ok")
    }
}
