import Foundation
import GRDBSQLite
import Testing
@testable import UserStoreCore

/// `ChangeLog.trim`: what `watch.keepChanges` and `watch.keepSeconds` leave of a store's change
/// log, on a real SQLite log (the daemon's own tables), times given rather than waited for.
@Suite struct ChangeLogTrimTests {
    /// A log of transactions 1...`count`, each with two changed rows, position p committed at
    /// p seconds after the epoch (`p * 1000` ms).
    private func log(count: Int) throws -> OpaquePointer {
        var connection: OpaquePointer?
        guard sqlite3_open_v2(":memory:", &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            throw ChangeLogError(message: "cannot open an in-memory database")
        }
        var sql = ChangeLog.create + "BEGIN;"
        for position in 1...count {
            for ordinal in 0..<2 {
                sql += "INSERT INTO userstore_changes (position, ordinal, committed_at, table_name, operation, row_id, row_values)"
                    + " VALUES (\(position), \(ordinal), \(position * 1000), 'notes', 'insert', \(position * 2 + ordinal), '{}');"
            }
        }
        guard sqlite3_exec(connection, sql + "COMMIT;", nil, nil, nil) == SQLITE_OK else {
            throw ChangeLogError(message: String(cString: sqlite3_errmsg(connection)))
        }
        return connection
    }

    /// The positions still in the log, in order, and its recorded state.
    private func kept(_ connection: OpaquePointer) -> (positions: [Int64], rows: Int, position: Int64, trimmedThrough: Int64) {
        var positions: [Int64] = [], rows = 0
        var statement: OpaquePointer?
        sqlite3_prepare_v2(connection, "SELECT position FROM userstore_changes ORDER BY position, ordinal", -1, &statement, nil)
        while sqlite3_step(statement) == SQLITE_ROW {
            rows += 1
            let position = sqlite3_column_int64(statement, 0)
            if positions.last != position { positions.append(position) }
        }
        sqlite3_finalize(statement)
        let state = ChangeLog.state(connection)
        return (positions, rows, state.position, state.trimmedThrough)
    }

    /// What a log of 100 transactions keeps after one trim with these limits.
    private func trimmed(keepChanges: Int, cutoffMilliseconds: Int64) throws -> (positions: [Int64], rows: Int, position: Int64, trimmedThrough: Int64) {
        let connection = try log(count: 100)
        defer { sqlite3_close(connection) }
        try ChangeLog.trim(connection, position: 100, keepChanges: keepChanges, cutoffMilliseconds: cutoffMilliseconds)
        return kept(connection)
    }

    @Test func theCountLimitKeepsTheNewestTransactionsWhole() throws {
        let result = try trimmed(keepChanges: 10, cutoffMilliseconds: 0)
        #expect(result.positions == Array(91...100))
        #expect(result.rows == 20) // both rows of each kept transaction
        #expect(result.position == 100)
        #expect(result.trimmedThrough == 90)
    }

    @Test func theAgeLimitDropsOlderTransactionsEvenAmongTheNewest() throws {
        // Committed before 40.5 s: positions 1...40, though the count limit would keep all 100.
        let result = try trimmed(keepChanges: 1_000, cutoffMilliseconds: 40_500)
        #expect(result.positions == Array(41...100))
        #expect(result.trimmedThrough == 40)
        #expect(result.position == 100)
    }

    @Test func whicheverLimitDropsMoreWins() throws {
        let connection = try log(count: 100)
        defer { sqlite3_close(connection) }
        try ChangeLog.trim(connection, position: 100, keepChanges: 30, cutoffMilliseconds: 40_500)
        #expect(kept(connection).positions == Array(71...100)) // the count limit drops more
        try ChangeLog.trim(connection, position: 100, keepChanges: 30, cutoffMilliseconds: 80_500)
        #expect(kept(connection).positions == Array(81...100)) // now the age limit does
        #expect(kept(connection).trimmedThrough == 80)
    }

    @Test func aLogWithinBothLimitsIsLeftAlone() throws {
        let result = try trimmed(keepChanges: 1_000, cutoffMilliseconds: 500)
        #expect(result.positions == Array(1...100))
        #expect(result.rows == 200)
        #expect(result.trimmedThrough == 0)
    }

    @Test func aLogTheAgeLimitEmptiesStillKnowsItsPosition() throws {
        let result = try trimmed(keepChanges: 1_000, cutoffMilliseconds: 1_000_000)
        #expect(result.positions.isEmpty)
        // The next transaction is 101 and a watcher resuming from 100 misses nothing.
        #expect(result.position == 100)
        #expect(result.trimmedThrough == 100)
    }
}
