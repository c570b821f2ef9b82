import GRDBSQLite
import Testing
@testable import UserStoreCore

/// ``StatementCache`` on a real SQLite connection: a statement is found by its SQL's bytes,
/// the least recently used one is finalised when the cache is full, and the statement used
/// last (checked before anything is hashed) never outlives its entry.
struct StatementCacheTests {
    final class Connection {
        var handle: OpaquePointer?
        init() throws {
            guard sqlite3_open(":memory:", &handle) == SQLITE_OK else { throw Failure() }
        }
        deinit { sqlite3_close_v2(handle) }

        func prepare(_ sql: String) throws -> OpaquePointer {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
                  let statement else { throw Failure() }
            return statement
        }

        /// Statements not finalised yet.
        var live: Int {
            var count = 0, statement = sqlite3_next_stmt(handle, nil)
            while let current = statement { count += 1; statement = sqlite3_next_stmt(handle, current) }
            return count
        }
    }

    struct Failure: Error {}

    func take(_ cache: StatementCache, _ sql: String) -> OpaquePointer? {
        Array(sql.utf8).withUnsafeBufferPointer { cache.take($0) }
    }

    func keep(_ cache: StatementCache, _ statement: OpaquePointer, _ sql: String) {
        Array(sql.utf8).withUnsafeBufferPointer { cache.keep(statement, for: $0) }
    }

    @Test func aStatementIsFoundByItsExactSQL() throws {
        let connection = try Connection(), cache = StatementCache(capacity: 4)
        let one = try connection.prepare("SELECT 1"), two = try connection.prepare("SELECT 2")
        keep(cache, one, "SELECT 1")
        keep(cache, two, "SELECT 2")
        #expect(take(cache, "SELECT 1") == one)
        #expect(take(cache, "SELECT 1") == one, "the repeat (the recent statement) is not the same")
        #expect(take(cache, "SELECT 2") == two)
        #expect(take(cache, "SELECT 1 ") == nil)
        #expect(take(cache, "SELECT") == nil)
        cache.finalizeAll()
        #expect(connection.live == 0)
        #expect(take(cache, "SELECT 1") == nil, "a finalised statement was handed out")
    }

    @Test func whenFullTheLeastRecentlyUsedIsFinalisedAndNeverHandedOutAgain() throws {
        let connection = try Connection(), cache = StatementCache(capacity: 2)
        let a = try connection.prepare("SELECT 'a'"), b = try connection.prepare("SELECT 'b'"), c = try connection.prepare("SELECT 'c'")
        keep(cache, a, "SELECT 'a'")
        keep(cache, b, "SELECT 'b'")
        #expect(take(cache, "SELECT 'a'") == a)
        #expect(take(cache, "SELECT 'a'") == a)
        keep(cache, c, "SELECT 'c'") // b is the least recently used
        #expect(connection.live == 2)
        #expect(take(cache, "SELECT 'b'") == nil)
        #expect(take(cache, "SELECT 'a'") == a)
        #expect(take(cache, "SELECT 'c'") == c)

        // Capacity 1: the statement used last is the one evicted, and must not be handed out.
        let single = StatementCache(capacity: 1)
        let d = try connection.prepare("SELECT 'd'"), e = try connection.prepare("SELECT 'e'")
        keep(single, d, "SELECT 'd'")
        #expect(take(single, "SELECT 'd'") == d)
        keep(single, e, "SELECT 'e'")
        #expect(take(single, "SELECT 'd'") == nil, "an evicted (finalised) statement was handed out")
        #expect(take(single, "SELECT 'e'") == e)
        cache.finalizeAll()
        single.finalizeAll()
        #expect(connection.live == 0)
    }
}
