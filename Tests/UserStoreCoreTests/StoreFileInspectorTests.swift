import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// What ``StoreFileInspector`` reads from a store's headers before SQLite opens it: the
/// schema version a listing shows, and the damage that keeps a file from being opened.
@Suite struct StoreFileInspectorTests {
    /// A real store at `user_version` 7, closed (no WAL left), and its path.
    func store(in directory: TemporaryDirectory, version: Int = 7) throws -> String {
        let path = directory.path + "/store.sqlite"
        let queue = try DatabaseQueue(path: path)
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
            try db.execute(sql: "PRAGMA user_version = \(version)")
        }
        try queue.close()
        return path
    }

    func bytes(_ path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }
    func write(_ bytes: [UInt8], to path: String) throws { try Data(bytes).write(to: URL(fileURLWithPath: path)) }

    @Test func aSoundStoreShowsNoDamageAndItsHeadersVersion() throws {
        let directory = try TemporaryDirectory()
        let path = try store(in: directory)
        #expect(StoreFileInspector.damage(of: path) == nil)
        #expect(StoreFileInspector.headerVersion(of: path) == 7)
    }

    @Test func anEmptyOrMissingFileIsNotDamage() throws {
        let directory = try TemporaryDirectory()
        let empty = directory.path + "/empty.sqlite"
        try write([], to: empty)
        #expect(StoreFileInspector.damage(of: empty) == nil)
        #expect(StoreFileInspector.headerVersion(of: empty) == 0)
        let missing = directory.path + "/missing.sqlite"
        #expect(StoreFileInspector.damage(of: missing) == nil)
        #expect(StoreFileInspector.headerVersion(of: missing) == -1)
    }

    @Test func aFileShorterThanItsHeaderIsTruncated() throws {
        let directory = try TemporaryDirectory()
        let path = try store(in: directory)
        try write(Array(try bytes(path).prefix(60)), to: path)
        #expect(StoreFileInspector.damage(of: path) == "truncated: 60 bytes, shorter than the 100-byte header")
        #expect(StoreFileInspector.headerVersion(of: path) == -1)
    }

    @Test func aFileShorterThanItsHeadersPageCountIsTruncated() throws {
        let directory = try TemporaryDirectory()
        let path = try store(in: directory)
        let whole = try bytes(path)
        try write(Array(whole.prefix(4096)), to: path)
        let damage = try #require(StoreFileInspector.damage(of: path))
        #expect(damage.hasPrefix("truncated: 4096 bytes, the header says \(whole.count / 4096) pages"))
    }

    @Test func aFileWithoutSQLitesMagicIsNotADatabase() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/text.sqlite"
        try write(Array(String(repeating: "not a database ", count: 20).utf8), to: path)
        #expect(StoreFileInspector.damage(of: path) == "not a SQLite database (no SQLite header)")
        #expect(StoreFileInspector.headerVersion(of: path) == -1)
    }

    @Test func aWALThatIsNotOneIsDamageAndANonEmptyWALHidesTheHeadersVersion() throws {
        let directory = try TemporaryDirectory()
        let path = try store(in: directory)
        try write(Array(repeating: 0x41, count: 16), to: path + "-wal")
        #expect(StoreFileInspector.damage(of: path) == "the WAL is shorter than its 32-byte header")
        #expect(StoreFileInspector.headerVersion(of: path) == nil) // only SQLite can tell
        try write(Array(repeating: 0x41, count: 64), to: path + "-wal")
        #expect(StoreFileInspector.damage(of: path) == "the WAL is not a WAL (bad magic number)")
        try write([], to: path + "-wal")
        #expect(StoreFileInspector.damage(of: path) == nil)
        #expect(StoreFileInspector.headerVersion(of: path) == 7)
    }
}
