import Foundation
import GRDBSQLite

/// The committed changes a store keeps for its watchers, in the store's own file (so they are
/// replicated, exported and erased with it): two bookkeeping tables, created by the store's
/// first Watch (``ChangeRecorder/startRecording(_:)``).
///
/// - `userstore_watch`: one row: the store's current **position** (one more per recorded
///   transaction, never reused) and the last position trimmed away.
/// - `userstore_changes`: one row per changed row (`ordinal` within its transaction) or per
///   reset, keyed by position; values as the JSON object a watcher receives.
///
/// Every function runs on the connection's holder, inside the transaction being recorded where
/// it writes.
public enum ChangeLog {
    static let create = """
        CREATE TABLE IF NOT EXISTS userstore_watch (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            position INTEGER NOT NULL,
            trimmed_through INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS userstore_changes (
            position INTEGER NOT NULL,
            ordinal INTEGER NOT NULL,
            committed_at INTEGER NOT NULL,
            table_name TEXT,
            operation TEXT NOT NULL,
            row_id INTEGER,
            row_values TEXT,
            PRIMARY KEY (position, ordinal)
        ) WITHOUT ROWID;
        """

    static let insertChange = """
        INSERT INTO userstore_changes (position, ordinal, committed_at, table_name, operation, row_id, row_values)
        VALUES (?, ?, ?, ?, ?, ?, ?)
        """

    /// Whether the tables exist on `connection`.
    static func exists(_ connection: OpaquePointer) -> Bool {
        var found = false
        _ = withStatement(connection, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'userstore_watch'") { statement in
            found = sqlite3_step(statement) == SQLITE_ROW
        }
        return found
    }

    /// The store's position and the last position trimmed away; (0, 0) before anything was
    /// recorded.
    static func state(_ connection: OpaquePointer) -> (position: Int64, trimmedThrough: Int64) {
        guard exists(connection) else { return (0, 0) }
        var state: (Int64, Int64) = (0, 0)
        _ = withStatement(connection, """
            SELECT max(coalesce((SELECT position FROM userstore_watch WHERE id = 1), 0),
                       coalesce((SELECT max(position) FROM userstore_changes), 0)),
                   coalesce((SELECT trimmed_through FROM userstore_watch WHERE id = 1), 0)
            """) { statement in
            if sqlite3_step(statement) == SQLITE_ROW {
                state = (sqlite3_column_int64(statement, 0), sqlite3_column_int64(statement, 1))
            }
        }
        return state
    }

    /// Makes the file at `staged`, about to replace the store at `current` (closed; it may not
    /// exist), go on from the current store's position: its next position is past both files'
    /// and is a reset, so that a watcher resuming from any position it was given learns that
    /// the store changed under it, and no position is used twice.
    /// Neither file recording (never watched): nothing to carry.
    static func continuePositions(from current: String, into staged: String,
                                  ciphers: (current: PageCipher?, staged: PageCipher?) = (nil, nil)) throws(ChangeLogError) {
        var previous: Int64 = 0, recorded = false
        if FileManager.default.fileExists(atPath: current) {
            var connection: OpaquePointer?
            if sqlite3_open_v2(current, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection,
               (try? ciphers.current?.install(on: connection)) != nil || ciphers.current == nil {
                recorded = exists(connection)
                previous = state(connection).position
            }
            sqlite3_close(connection)
        }
        let connection = try open(staged, "to carry the change log's position", cipher: ciphers.staged)
        defer { sqlite3_close(connection) }
        guard recorded || exists(connection) else { return }
        try recordReset(connection, at: max(previous, state(connection).position) + 1, droppingTheLog: true)
    }

    /// How far a store's position jumps when it comes back from the replica
    /// (``continuePositionsAfterReplicaRestore(_:)``): more transactions than a store commits
    /// before its replica catches up.
    static let replicaRestoreJump: Int64 = 1 << 32

    /// The file at `path` was just restored from the replica (a lost disk, another host taking
    /// the store over), which may lack the store's last transactions — whose positions watchers
    /// may have been sent already, before they reached the replica. The next transactions must
    /// not take those positions again, or a watcher resuming from one would silently skip the
    /// new transactions up to it: the position jumps by ``replicaRestoreJump`` to a reset, so a
    /// watcher resuming from any position it was given re-reads. What the log holds before the
    /// jump is kept (a watcher behind the replica still gets those transactions first).
    /// A store that never recorded (never watched): nothing to carry.
    public static func continuePositionsAfterReplicaRestore(_ path: String, cipher: PageCipher? = nil) throws(ChangeLogError) {
        let connection = try open(path, "to move its change log past the replica's positions", cipher: cipher)
        defer { sqlite3_close(connection) }
        guard exists(connection) else { return }
        try recordReset(connection, at: state(connection).position + replicaRestoreJump, droppingTheLog: false)
    }

    /// A connection of its own to the store file at `path` (closed, or not yet opened, by the
    /// daemon), to change its log `purpose`.
    /// An encrypted store's file is opened with `cipher` (its user's).
    private static func open(_ path: String, _ purpose: String, cipher: PageCipher? = nil) throws(ChangeLogError) -> OpaquePointer {
        var connection: OpaquePointer?
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            sqlite3_close(connection)
            throw ChangeLogError(message: "cannot open \(path) \(purpose)")
        }
        if let cipher {
            do {
                try cipher.install(on: connection)
            } catch {
                sqlite3_close(connection)
                throw ChangeLogError(message: "cannot decrypt \(path) \(purpose): \(error)")
            }
        }
        return connection
    }

    /// Makes `position` the store's, as a reset, in one transaction; `droppingTheLog` empties
    /// the log first (everything before the reset counts as trimmed), else the log is kept.
    private static func recordReset(_ connection: OpaquePointer, at position: Int64, droppingTheLog: Bool) throws(ChangeLogError) {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let trimmed = droppingTheLog ? position - 1 : 0
        let sql = create + "BEGIN IMMEDIATE;"
            + "INSERT INTO userstore_watch (id, position, trimmed_through) VALUES (1, \(position), \(trimmed))"
            + " ON CONFLICT (id) DO UPDATE SET position = \(position)" + (droppingTheLog ? ", trimmed_through = \(trimmed);" : ";")
            + (droppingTheLog ? "DELETE FROM userstore_changes;" : "")
            + "INSERT INTO userstore_changes (position, ordinal, committed_at, operation) VALUES (\(position), 0, \(now), 'reset');"
            + "COMMIT;"
        guard sqlite3_exec(connection, sql, nil, nil, nil) == SQLITE_OK else {
            let message = String(cString: sqlite3_errmsg(connection))
            sqlite3_exec(connection, "ROLLBACK", nil, nil, nil)
            throw ChangeLogError(message: message)
        }
    }

    /// Drops what is past the limits: positions more than `keepChanges` behind `position`, and
    /// those committed before `cutoffMilliseconds` (Unix time). Records the highest dropped.
    static func trim(_ connection: OpaquePointer, position: Int64, keepChanges: Int, cutoffMilliseconds: Int64) throws(ChangeLogError) {
        var through = max(0, position - Int64(keepChanges))
        // The oldest kept transaction first (the key's first row): only when it is past the age
        // limit is the log scanned for the last one that is.
        var oldestExpired = false
        try withStatement(connection, "SELECT committed_at < ? FROM userstore_changes ORDER BY position LIMIT 1") { statement in
            sqlite3_bind_int64(statement, 1, cutoffMilliseconds)
            oldestExpired = sqlite3_step(statement) == SQLITE_ROW && sqlite3_column_int64(statement, 0) != 0
        }.get()
        if oldestExpired { try withStatement(connection, "SELECT max(position) FROM userstore_changes WHERE committed_at < ?") { statement in
            sqlite3_bind_int64(statement, 1, cutoffMilliseconds)
            if sqlite3_step(statement) == SQLITE_ROW, sqlite3_column_type(statement, 0) != SQLITE_NULL {
                through = max(through, sqlite3_column_int64(statement, 0))
            }
        }.get() }
        guard through > 0 else { return }
        try withStatement(connection, "DELETE FROM userstore_changes WHERE position <= ?") { statement in
            sqlite3_bind_int64(statement, 1, through)
            _ = sqlite3_step(statement)
        }.get()
        // The position too: a trim may empty the log, where the position is read from otherwise.
        try withStatement(connection, """
            INSERT INTO userstore_watch (id, position, trimmed_through) VALUES (1, ?, ?)
            ON CONFLICT (id) DO UPDATE SET position = max(position, excluded.position), trimmed_through = max(trimmed_through, excluded.trimmed_through)
            """) { statement in
            sqlite3_bind_int64(statement, 1, position)
            sqlite3_bind_int64(statement, 2, through)
            _ = sqlite3_step(statement)
        }.get()
    }

    /// The recorded transactions after `since`, in order, at most `limit`.
    static func events(_ connection: OpaquePointer, after since: Int64, limit: Int) -> [ChangeEvent] {
        var events: [ChangeEvent] = []
        _ = withStatement(connection, """
            SELECT position, committed_at, table_name, operation, row_id, row_values FROM userstore_changes
            WHERE position > ? AND position <= (SELECT max(position) FROM (SELECT DISTINCT position FROM userstore_changes WHERE position > ? ORDER BY position LIMIT ?))
            ORDER BY position, ordinal
            """) { statement in
            sqlite3_bind_int64(statement, 1, since)
            sqlite3_bind_int64(statement, 2, since)
            sqlite3_bind_int64(statement, 3, Int64(limit))
            while sqlite3_step(statement) == SQLITE_ROW {
                let position = sqlite3_column_int64(statement, 0)
                let operation = text(statement, 3) ?? ""
                if events.last?.position != position {
                    events.append(ChangeEvent(position: position, committedAt: sqlite3_column_int64(statement, 1), reset: false, changes: []))
                }
                if operation == "reset" {
                    events[events.count - 1].reset = true
                    continue
                }
                guard let kind = ChangeEvent.Operation(rawValue: operation), let table = text(statement, 2) else { continue }
                events[events.count - 1].changes.append(ChangeEvent.Change(table: table, operation: kind, rowid: sqlite3_column_int64(statement, 4),
                                                                           values: text(statement, 5).map { Array($0.utf8) }))
            }
        }
        return events
    }

    private static func text(_ statement: OpaquePointer, _ column: Int32) -> String? {
        guard sqlite3_column_type(statement, column) != SQLITE_NULL, let text = sqlite3_column_text(statement, column) else { return nil }
        return String(cString: text)
    }

    /// Prepares `sql`, runs `body` with it, finalizes it.
    @discardableResult
    static func withStatement(_ connection: OpaquePointer, _ sql: String, _ body: (OpaquePointer) -> Void) -> Result<Void, ChangeLogError> {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(connection, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            return .failure(ChangeLogError(message: String(cString: sqlite3_errmsg(connection))))
        }
        defer { sqlite3_finalize(statement) }
        body(statement)
        let code = sqlite3_errcode(connection)
        guard code == SQLITE_OK || code == SQLITE_ROW || code == SQLITE_DONE else {
            return .failure(ChangeLogError(message: String(cString: sqlite3_errmsg(connection))))
        }
        return .success(())
    }
}

/// The change log could not be read or written (SQLite's message).
public struct ChangeLogError: Error, Sendable {
    public let message: String
}
