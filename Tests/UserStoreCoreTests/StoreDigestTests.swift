import Foundation
import GRDB
import Synchronization
import Testing
@testable import UserStoreCore

/// ``StoreDigest``: what the replica check compares. Equal rows and schema give equal digests
/// however the pages lie; any change to a row, a table or the schema shows, and says where.
struct StoreDigestTests {
    /// A WAL database at `name` in `directory` with `sql` run on it.
    static func database(_ directory: TemporaryDirectory, _ name: String, _ sql: String) throws -> String {
        let path = directory.path + "/" + name
        let queue = try DatabaseQueue(path: path)
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: sql)
        }
        try queue.close()
        return path
    }

    static let notes = """
        CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body BLOB, score REAL);
        CREATE INDEX notes_by_title ON notes (title);
        CREATE TABLE tags (name TEXT PRIMARY KEY, uses INTEGER) WITHOUT ROWID;
        INSERT INTO notes (title, body, score) VALUES ('a', x'00ff', 1.5), ('b', 1, 2), ('c', x'', NULL);
        INSERT INTO tags VALUES ('x', 1), ('y', 2);
        """

    @Test func theSameRowsInOtherPagesHaveTheSameDigest() throws {
        let directory = try TemporaryDirectory()
        let original = try Self.database(directory, "a.sqlite", Self.notes + """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO notes (title) SELECT 'filler' || i FROM n;
            DELETE FROM notes WHERE title LIKE 'filler%';
            """)
        let copy = directory.path + "/b.sqlite"
        let queue = try DatabaseQueue(path: original)
        try queue.writeWithoutTransaction { try $0.execute(sql: "VACUUM INTO '\(copy)'") }
        try queue.close()
        // The same rows inserted in another order (WITHOUT ROWID and rowid tables alike).
        let reordered = try Self.database(directory, "c.sqlite", """
            CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body BLOB, score REAL);
            CREATE INDEX notes_by_title ON notes (title);
            CREATE TABLE tags (name TEXT PRIMARY KEY, uses INTEGER) WITHOUT ROWID;
            INSERT INTO tags VALUES ('y', 2), ('x', 1);
            INSERT INTO notes (id, title, body, score) VALUES (3, 'c', x'', NULL), (1, 'a', x'00ff', 1.5), (2, 'b', 1, 2);
            """)
        let digest = try StoreDigest.read(path: original)
        #expect(try StoreDigest.read(path: copy) == digest)
        #expect(try StoreDigest.read(path: reordered) == digest)
        #expect(digest.tables["notes"]?.rows == 3 && digest.tables["tags"]?.rows == 2)
    }

    @Test(arguments: [
        ("UPDATE notes SET title = 'A' WHERE id = 1", "table notes: 3 rows in both, with different contents"),
        ("UPDATE notes SET body = 1.0 WHERE id = 2", "table notes: 3 rows in both, with different contents"),
        ("UPDATE notes SET body = '1' WHERE id = 2", "table notes: 3 rows in both, with different contents"),
        ("UPDATE notes SET title = x'61' WHERE id = 1", "table notes: 3 rows in both, with different contents"),
        ("DELETE FROM notes WHERE id = 3", "table notes: 3 rows here, 2 in the replica"),
        ("UPDATE tags SET uses = 3 WHERE name = 'y'", "table tags: 2 rows in both, with different contents"),
        ("DROP TABLE tags", "table tags: 2 rows here, missing from the replica"),
        ("CREATE INDEX tags_by_uses ON tags (uses)", "the schema differs"),
    ])
    func everyChangeShowsWhereItIs(change: String, difference: String) throws {
        let directory = try TemporaryDirectory()
        let live = try StoreDigest.read(path: try Self.database(directory, "live.sqlite", Self.notes))
        let replica = try StoreDigest.read(path: try Self.database(directory, "replica.sqlite", Self.notes + change))
        #expect(live.differences(from: replica).contains(difference), "\(live.differences(from: replica))")
        #expect(live.differences(from: live).isEmpty)
    }

    /// Litestream writes its own tables in the live file only: they never count.
    @Test func litestreamsTablesAreLeftOut() throws {
        let directory = try TemporaryDirectory()
        let live = try Self.database(directory, "live.sqlite", Self.notes + """
            CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER);
            CREATE TABLE _litestream_lock (id INTEGER);
            INSERT INTO _litestream_seq VALUES (1, 42);
            """)
        let replica = try Self.database(directory, "replica.sqlite", Self.notes)
        #expect(try StoreDigest.read(path: live) == StoreDigest.read(path: replica))
    }

    /// A pinned reader sees the file as it was when pinned, whatever is written afterwards.
    @Test func aPinnedReaderSeesThePointItWasPinnedAt() throws {
        let directory = try TemporaryDirectory()
        let path = try Self.database(directory, "live.sqlite", Self.notes)
        let before = try StoreDigest.read(path: path)
        let writer = try DatabaseQueue(path: path)
        let reader = try StoreDigest.Reader(path: path)
        try reader.pin()
        try writer.write { try $0.execute(sql: "INSERT INTO notes (title) VALUES ('later')") }
        #expect(try reader.digest() == before)
        reader.close()
        #expect(try StoreDigest.read(path: path).tables["notes"]?.rows == 4)
        try writer.close()
    }
}

/// ``Store/whileHeld(_:)``: nothing else runs on the store until the body returns.
struct StoreHoldTests {
    @Test func workSubmittedDuringAHoldWaitsForItsEnd() async throws {
        let directory = try TemporaryDirectory()
        let migrations = try MigrationFolder(directory).write("0001_t.sql", "CREATE TABLE t (v TEXT);").load()
        let harness = try Harness(directory: directory, migrations: migrations)
        let order = Mutex<[String]>([])
        try await harness.registry.withStore(user("ann")) { store in
            let written = try await store.whileHeld {
                #expect(store.runIfIdle { _ in true } == nil, "the fast path ran during a hold")
                let written = AsyncStream<Void>.makeStream()
                store.enqueue({ db in
                    try? db.execute(sql: "INSERT INTO t VALUES ('queued')")
                    order.withLock { $0.append("queued work") }
                }, completion: { written.continuation.finish() })
                // Time for the queued work to run, were it not held back.
                try await Task.sleep(for: .milliseconds(50))
                order.withLock { $0.append("hold ends") }
                return written.stream
            }
            for await _ in written {}
            #expect(order.withLock { $0 } == ["hold ends", "queued work"])
            #expect(store.runIfIdle { _ in true } == true)
        }
        await harness.registry.shutdown()
    }
}
