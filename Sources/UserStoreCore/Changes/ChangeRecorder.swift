import CSQLiteSettings
import Foundation
import GRDBSQLite
import VarlinkJSON

/// How much of its change log a store keeps (`watch.*` in the configuration).
public struct ChangeRetention: Sendable, Equatable {
    /// The newest transactions kept; older positions are dropped (the log is trimmed every
    /// ``ChangeRecorder/trimEvery`` positions, so up to that many more wait for the next trim).
    public var keepChanges: Int
    /// Seconds a transaction is kept at most: an older one is dropped even among the newest
    /// ``keepChanges`` (whichever limit drops more wins).
    public var keepSeconds: Int

    public init(keepChanges: Int = 10_000, keepSeconds: Int = 7 * 86_400) {
        self.keepChanges = keepChanges
        self.keepSeconds = keepSeconds
    }
}

/// Records the rows each committed transaction of a store changed, for its watchers, inside that
/// same transaction: nothing committed goes unrecorded, nothing rolled back is recorded.
///
/// SQLite's pre-update hook (Debian's libsqlite3 has it; the session extension would also need a
/// primary key on every table) hands over every row a statement inserts, updates or deletes,
/// with its new values. While a **client** statement runs (``StoreGuard`` under its client
/// rules) the row is kept as a change; a change made by anything else — a migration, the
/// daemon's own work, an import — only marks the store for a **reset**. ``flush(_:)`` writes
/// the transaction's changes into ``ChangeLog`` just before its COMMIT (the paths that commit
/// client work call it); ``afterWork(_:)``, after each piece of work on the connection, writes a
/// pending reset in a transaction of its own and publishes what committed to ``feed``.
///
/// Touched only by the connection's holder (the store's queue), hence `@unchecked Sendable`.
public final class ChangeRecorder: @unchecked Sendable {
    /// Positions between trims of the log.
    public static let trimEvery: Int64 = 64
    /// Changed rows one transaction may report; past that it is reported as a reset.
    public static let maxChangesPerTransaction = 10_000

    /// Where committed events go.
    public let feed = ChangeFeed()
    public let retention: ChangeRetention
    private let guardian: StoreGuard

    private struct Pending {
        var table: String
        var operation: ChangeEvent.Operation
        var rowid: Int64
        /// The new row's values, each JSON-encoded, in column order (nil for a delete).
        var values: [[UInt8]]?
    }

    private var pending: [Pending] = []
    /// Savepoints open in the current transaction, with the number of changes before each.
    private var savepoints: [(name: String, mark: Int)] = []
    /// Rows were changed by something other than a client statement (or too many to list).
    private var resetPending = false
    /// Flushed in the transaction that is committing; published once it has.
    private var awaiting: ChangeEvent?
    /// The store's position as this connection last wrote it (nil: read it from the file).
    private var lastPosition: Int64?
    /// The log's statements and the daemon's transaction control, prepared once for the
    /// connection's life (``finalize()``).
    private let statements = StatementCache(capacity: 8)
    /// Whether the log's tables exist (nil: not looked yet).
    fileprivate var logExists: Bool?
    /// Column names per table, read at flush; emptied when the schema changes.
    private var columnNames: [String: [String]] = [:]
    private var schemaVersion: Int64 = -1

    init(guardian: StoreGuard, retention: ChangeRetention) {
        self.guardian = guardian
        self.retention = retention
    }

    /// Installs the hooks on `connection`, which must not outlive `self`.
    func install(on connection: OpaquePointer) {
        let context = Unmanaged.passUnretained(self).toOpaque()
        _ = userstore_preupdate_hook(connection, { context, connection, operation, schema, table, oldRowid, newRowid in
            guard let context, let connection, let schema, let table, strcmp(schema, "main") == 0 else { return }
            let recorder = Unmanaged<ChangeRecorder>.fromOpaque(context).takeUnretainedValue()
            guard recorder.logExists == true else { return } // not recording: nothing to look at
            recorder.preupdate(connection, operation, String(cString: table), oldRowid, newRowid)
        }, context)
        sqlite3_rollback_hook(connection, { context in
            Unmanaged<ChangeRecorder>.fromOpaque(context!).takeUnretainedValue().discard()
        }, context)
        sqlite3_commit_hook(connection, { context in
            let recorder = Unmanaged<ChangeRecorder>.fromOpaque(context!).takeUnretainedValue()
            // Client changes committed without a flush (a path that forgot it): the log cannot
            // get them into this transaction any more; watchers are told to re-read instead.
            if !recorder.pending.isEmpty { recorder.markReset() }
            return 0
        }, context)
    }

    /// Whether `table` is the daemon's, SQLite's or the replicator's, not the app's.
    static func isInternal(_ table: String) -> Bool {
        let name = table.lowercased()
        return name.hasPrefix("sqlite_") || name.hasPrefix("userstore_") || StoreGuard.isBookkeeping(name)
    }

    private func preupdate(_ connection: OpaquePointer, _ operation: Int32, _ table: String, _ oldRowid: Int64, _ newRowid: Int64) {
        guard !Self.isInternal(table) else { return }
        guard guardian.runningClientStatement, !resetPending else { markReset(); return }
        guard pending.count < Self.maxChangesPerTransaction else { markReset(); return }
        switch operation {
        case SQLITE_DELETE:
            pending.append(Pending(table: table, operation: .delete, rowid: oldRowid, values: nil))
        case SQLITE_INSERT, SQLITE_UPDATE:
            var values: [[UInt8]] = []
            let count = userstore_preupdate_count(connection)
            values.reserveCapacity(Int(count))
            for column in 0..<count {
                var value: OpaquePointer?
                var writer = JSONWriter(capacity: 16)
                if userstore_preupdate_new(connection, column, &value) == SQLITE_OK, let value {
                    ValueJSON.write(value: value, into: &writer)
                } else {
                    writer.raw("null")
                }
                values.append(writer.bytes)
            }
            pending.append(Pending(table: table, operation: operation == SQLITE_INSERT ? .insert : .update, rowid: newRowid, values: values))
        default:
            break
        }
    }

    private func markReset() {
        resetPending = true
        pending.removeAll(keepingCapacity: false)
        savepoints.removeAll()
    }

    /// Forgets the transaction's changes (it rolled back).
    func discard() {
        lastPosition = nil // what was counted in the rolled-back transaction is read again
        pending.removeAll()
        savepoints.removeAll()
        resetPending = false
        awaiting = nil
    }

    // MARK: Savepoints inside a transaction

    /// A client's `SAVEPOINT name`, `RELEASE [SAVEPOINT] name` or `ROLLBACK TO [SAVEPOINT]
    /// name` ran: keeps the changes in step with what the transaction still holds.
    public func savepoint(_ statement: SavepointStatement) {
        switch statement {
        case .begin(let name):
            savepoints.append((name.lowercased(), pending.count))
        case .release(let name):
            if let index = savepoints.lastIndex(where: { $0.name == name.lowercased() }) { savepoints.removeSubrange(index...) }
        case .rollback(let name):
            guard let index = savepoints.lastIndex(where: { $0.name == name.lowercased() }) else { markReset(); return }
            pending.removeSubrange(min(savepoints[index].mark, pending.count)...)
            savepoints.removeSubrange((index + 1)...)
        }
    }

    /// A savepoint statement, as ``savepoint(_:)`` follows them.
    public enum SavepointStatement: Sendable, Equatable {
        case begin(String), release(String), rollback(String)

        /// The savepoint statement `sql` is, if it is one (nil: any other statement). Comments
        /// and quoted names are read as SQLite reads them (``SQLTokenizer``).
        public static func parse(_ sql: String) -> SavepointStatement? {
            guard let first = SQLScript.firstKeyword(of: sql), ["SAVEPOINT", "RELEASE", "ROLLBACK"].contains(first) else { return nil }
            let words = SQLTokenizer.tokens(sql).filter { $0.kind != .comment && $0.text != ";" }
            // The name: the token after the keyword, an optional SAVEPOINT and (for ROLLBACK) TO.
            func name(after index: Int) -> String? {
                var index = index
                if index < words.count, words[index].identifier == "savepoint" { index += 1 }
                return index < words.count ? words[index].identifier : nil
            }
            switch first {
            case "SAVEPOINT": return name(after: 1).map { .begin($0) }
            case "RELEASE": return name(after: 1).map { .release($0) }
            default: // ROLLBACK [TRANSACTION] TO [SAVEPOINT] name; a plain ROLLBACK is not one
                var index = 1
                if index < words.count, words[index].identifier == "transaction" { index += 1 }
                guard index < words.count, words[index].identifier == "to" else { return nil }
                return name(after: index + 1).map { .rollback($0) }
            }
        }
    }

    // MARK: Writing the log

    /// Whether the transaction has anything to record.
    private var hasPending: Bool { !pending.isEmpty || resetPending }

    /// Writes the open transaction's changes (or its reset) into the log; call it inside the
    /// transaction, right before its COMMIT. Their event is published once the COMMIT is
    /// through (``afterWork(_:)``).
    public func flush(_ connection: OpaquePointer) throws(ChangeLogError) {
        guard hasPending, logExists == true else { return } // the log's tables exist once recording
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        lastPosition = try guardian.withoutClientRules { () throws(ChangeLogError) -> Int64 in
            // The position is counted here: this connection is the file's only writer. It is read
            // once per connection (the log's newest position; `userstore_watch` holds it when
            // trims emptied the log) and written to `userstore_watch` only when trimming, so a
            // commit writes one page of the log, not two.
            let position = (lastPosition ?? ChangeLog.state(connection).position) + 1
            var event = ChangeEvent(position: position, committedAt: now, reset: resetPending, changes: [])
            if !resetPending {
                refreshColumnNames(connection)
                event.changes = pending.map { change in
                    ChangeEvent.Change(table: change.table, operation: change.operation, rowid: change.rowid,
                                       values: change.values.map { row(of: change.table, $0, connection) })
                }
            }
            try insert(event, connection)
            if position % Self.trimEvery == 0 {
                try ChangeLog.trim(connection, position: position, keepChanges: retention.keepChanges,
                                   cutoffMilliseconds: now - Int64(retention.keepSeconds) * 1000)
            }
            awaiting = event
            return position
        }
        pending.removeAll(keepingCapacity: true)
        savepoints.removeAll()
        resetPending = false
    }

    private func insert(_ event: ChangeEvent, _ connection: OpaquePointer) throws(ChangeLogError) {
        var failed = false
        try withPrepared(connection, ChangeLog.insertChange) { statement in
            func row(_ ordinal: Int, _ table: String?, _ operation: String, _ rowid: Int64?, _ values: [UInt8]?) {
                sqlite3_bind_int64(statement, 1, event.position)
                sqlite3_bind_int64(statement, 2, Int64(ordinal))
                sqlite3_bind_int64(statement, 3, event.committedAt)
                if let table { sqlite3_bind_text(statement, 4, table, -1, SQLITE_TRANSIENT) } else { sqlite3_bind_null(statement, 4) }
                sqlite3_bind_text(statement, 5, operation, -1, SQLITE_TRANSIENT)
                if let rowid { sqlite3_bind_int64(statement, 6, rowid) } else { sqlite3_bind_null(statement, 6) }
                if let values {
                    _ = values.withUnsafeBytes { sqlite3_bind_text(statement, 7, $0.baseAddress!.assumingMemoryBound(to: CChar.self), Int32($0.count), SQLITE_TRANSIENT) }
                } else {
                    sqlite3_bind_null(statement, 7)
                }
                failed = sqlite3_step(statement) != SQLITE_DONE
                sqlite3_reset(statement)
            }
            if event.reset {
                row(0, nil, "reset", nil, nil)
            } else {
                for (ordinal, change) in event.changes.enumerated() {
                    row(ordinal, change.table, change.operation.rawValue, change.rowid, change.values)
                    if failed { break }
                }
            }
        }
        if failed { throw ChangeLogError(message: String(cString: sqlite3_errmsg(connection))) }
    }

    /// `{"column": value, …}` from the values in column order.
    private func row(of table: String, _ values: [[UInt8]], _ connection: OpaquePointer) -> [UInt8] {
        let names = columnNames(table, connection)
        var writer = JSONWriter(capacity: 64)
        writer.raw(byte: UInt8(ascii: "{"))
        for (index, value) in values.enumerated() {
            if index > 0 { writer.raw(byte: UInt8(ascii: ",")) }
            writer.write(index < names.count ? names[index] : "column\(index + 1)")
            writer.raw(byte: UInt8(ascii: ":"))
            writer.bytes.append(contentsOf: value)
        }
        writer.raw(byte: UInt8(ascii: "}"))
        return writer.bytes
    }

    private func refreshColumnNames(_ connection: OpaquePointer) {
        var version: Int64 = 0
        _ = try? withPrepared(connection, "PRAGMA schema_version") { statement in
            if sqlite3_step(statement) == SQLITE_ROW { version = sqlite3_column_int64(statement, 0) }
            sqlite3_reset(statement)
        }
        if version != schemaVersion {
            columnNames.removeAll()
            schemaVersion = version
        }
    }

    private func columnNames(_ table: String, _ connection: OpaquePointer) -> [String] {
        if let names = columnNames[table] { return names }
        var names: [String] = []
        // table_xinfo: generated columns too, which the pre-update hook also hands over.
        ChangeLog.withStatement(connection, "SELECT name FROM pragma_table_xinfo(?)") { statement in
            sqlite3_bind_text(statement, 1, table, -1, SQLITE_TRANSIENT)
            while sqlite3_step(statement) == SQLITE_ROW { names.append(String(cString: sqlite3_column_text(statement, 0))) }
        }
        columnNames[table] = names
        return names
    }

    /// After each piece of work on the connection: once no transaction is open, records a
    /// pending reset (its own transaction) and publishes what committed.
    func afterWork(_ connection: OpaquePointer) {
        guard sqlite3_get_autocommit(connection) != 0 else { return }
        // A store that does not record needs no reset: nobody holds a position in it (and a
        // fleet migration must not write a log into every store).
        if resetPending, !hasLog(connection) { resetPending = false }
        if resetPending, transactionControl(connection, "BEGIN IMMEDIATE") == SQLITE_OK {
            do {
                try flush(connection)
                if transactionControl(connection, "COMMIT") != SQLITE_OK { _ = transactionControl(connection, "ROLLBACK") }
            } catch {
                _ = transactionControl(connection, "ROLLBACK")
            }
        }
        if let event = awaiting {
            awaiting = nil
            feed.publish(event)
        }
    }

    /// Whether the store records its changes: from the first Watch of it on (``startRecording(_:)``).
    /// A store nobody ever watched records nothing and pays nothing; once watched, every commit
    /// is recorded, watched at that moment or not, so that a watcher can resume. Read once per
    /// connection.
    public func isRecording(_ connection: OpaquePointer) -> Bool { hasLog(connection) }

    /// Makes the store record its changes from now on (the log's tables); called by a Watch on
    /// the store's queue, outside any transaction, before it reads the position.
    public func startRecording(_ connection: OpaquePointer) throws(ChangeLogError) {
        guard !hasLog(connection) else { return }
        try guardian.withoutClientRules { () throws(ChangeLogError) in
            guard sqlite3_exec(connection, ChangeLog.create, nil, nil, nil) == SQLITE_OK else {
                throw ChangeLogError(message: String(cString: sqlite3_errmsg(connection)))
            }
        }
        logExists = true
    }

    private func hasLog(_ connection: OpaquePointer) -> Bool {
        if let logExists { return logExists }
        let exists = ChangeLog.exists(connection)
        logExists = exists
        return exists
    }

    /// Runs `body` with `sql` prepared once for the connection's life.
    private func withPrepared(_ connection: OpaquePointer, _ sql: String, _ body: (OpaquePointer) -> Void) throws(ChangeLogError) {
        var sql = sql
        let statement = sql.withUTF8 { bytes -> OpaquePointer? in
            if let kept = statements.take(bytes) { return kept }
            var statement: OpaquePointer?
            guard sqlite3_prepare_v3(connection, bytes.baseAddress, Int32(bytes.count), UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
                  let statement else { return nil }
            statements.keep(statement, for: bytes)
            return statement
        }
        guard let statement else { throw ChangeLogError(message: String(cString: sqlite3_errmsg(connection))) }
        body(statement)
    }

    /// `BEGIN IMMEDIATE`, `COMMIT` or `ROLLBACK` for a client's autocommit write
    /// (ChangeRecording), prepared once; SQLite's result code.
    public func transactionControl(_ connection: OpaquePointer, _ sql: StaticString) -> Int32 {
        var code = SQLITE_MISUSE
        do {
            try withPrepared(connection, "\(sql)") { statement in
                code = sqlite3_step(statement)
                sqlite3_reset(statement)
            }
        } catch {
            return SQLITE_ERROR
        }
        return code == SQLITE_DONE ? SQLITE_OK : code
    }

    /// Finalizes the statements kept prepared; before the connection closes.
    func finalize() {
        statements.finalizeAll()
    }

    /// Marks the store for a reset (its schema or contents changed under the watchers: a
    /// migration that changed no row still changes what the app reads).
    public func requestReset() {
        resetPending = true
    }

    /// The store's position and the last one trimmed away (on the connection's holder).
    public func state(_ connection: OpaquePointer) -> (position: Int64, trimmedThrough: Int64) {
        ChangeLog.state(connection)
    }

    /// The recorded events after `since` (at most `limit`), on the connection's holder.
    public func events(_ connection: OpaquePointer, after since: Int64, limit: Int) -> [ChangeEvent] {
        ChangeLog.events(connection, after: since, limit: limit)
    }
}

private let SQLITE_TRANSIENT = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
