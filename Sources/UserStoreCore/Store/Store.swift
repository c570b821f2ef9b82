import CSQLiteSettings
import GRDB
import GRDBSQLite
import Synchronization

/// One user's open store: a single SQLite connection behind its own serial queue.
///
/// All work on the connection is *submitted*: it waits in the store's list in arrival order and
/// runs one at a time on GRDB's dispatch queue (one GCD block drains whatever is waiting), so
/// statements for one user run one at a time in arrival order while different users' stores run
/// in parallel. The only exception is ``runIfIdle(_:)``, which runs a short read right away when
/// nothing is waiting or running.
///
/// An interactive transaction (``beginTransaction(_:immediate:)``) *holds* the store: while it
/// is open only its own work runs, and everything else waits, in order, until it commits or
/// rolls back. Other stores never wait.
///
/// Obtain stores from a ``StoreRegistry``, which guarantees one connection per file.
public final class Store: Sendable {
    /// Whose store this is.
    public let user: UserID
    /// The store's file.
    public let path: String
    /// GRDB's `DatabaseQueue`: it opened and configured the connection, and its dispatch queue
    /// is the thread the store's work runs on. Only ``drain(_:)`` and the opening and closing
    /// of the store use it: everything else goes through ``write(_:)``, ``read(_:)`` and
    /// ``enqueue(transaction:_:completion:)``, which keep the order and the transaction's hold.
    private let queue: DatabaseQueue
    /// The connection's authorizer and deadline for client statements.
    public let guardian: StoreGuard
    /// Prepared client statements; use only while holding the connection (in submitted work or
    /// ``runIfIdle(_:)``).
    public let statements: StatementCache
    /// Work submitted and not finished, plus one while a transaction is open: ``runIfIdle(_:)``
    /// runs only at zero.
    private let queued = Atomic<Int>(0)
    /// The SQLite connection behind ``queue``, reachable only while holding it: by submitted
    /// work (the drain holds it around each piece) or by ``runIfIdle(_:)`` on another thread.
    private let connection: Mutex<RawConnection>

    /// The raw connection as the mutex holds it: a pointer SQLite lets one thread use at a time,
    /// which the mutex guarantees (`@unchecked Sendable` for that reason alone).
    private struct RawConnection: @unchecked Sendable {
        let pointer: OpaquePointer
        /// The store is closing: the pointer is not used again (``runIfIdle(_:)`` may be called
        /// without a lease, by ``releaseMemoryIfIdle()``).
        var closed = false
    }
    private let schedule = Mutex(Schedule())
    /// Why the store was found damaged while serving (SQLite reported corruption); the
    /// registry refuses it to clients from then on.
    private let damage = Mutex<String?>(nil)

    /// Records that SQLite found the file damaged: no more client work is served from it.
    public func markDamaged(_ message: String) {
        damage.withLock { if $0 == nil { $0 = message } }
    }

    /// Why the store is damaged, if it was found so.
    public var damaged: String? { damage.withLock { $0 } }

    /// Work waiting for the connection, in arrival order, and the transaction holding it.
    private struct Schedule {
        var waiting: [Work] = []
        var draining = false
        var owner: TransactionKey?
    }

    /// Identifies an open interactive transaction on its store.
    public struct TransactionKey: Hashable, Sendable {
        public let value: UInt64
        public init(_ value: UInt64) { self.value = value }
    }

    private struct Work {
        /// The transaction it belongs to (nil: ordinary work, which waits while one is open).
        let transaction: TransactionKey?
        /// Runs with the connection held; returns what to do once it is released.
        let run: @Sendable (Database) -> (@Sendable () -> Void)
    }

    /// The WAL hook of a replicated store (a registry with a ``StoreReplication``): which commits
    /// the replicator has yet to sync, and whether the store checkpoints itself.
    public let wal: WALHook
    /// Records committed changes for the store's watchers (nil: the change stream is off).
    public let recorder: ChangeRecorder?

    init(user: UserID, path: String, queue: DatabaseQueue, guardian: StoreGuard, wal: WALHook = WALHook(), recorder: ChangeRecorder? = nil) {
        self.wal = wal
        self.recorder = recorder
        self.connection = Mutex(RawConnection(pointer: queue.inDatabase { $0.sqliteConnection! }))
        self.user = user
        self.path = path
        self.queue = queue
        self.guardian = guardian
        self.statements = StatementCache()
    }

    // MARK: Submitting work

    /// Adds `work` to the store's list and makes sure a drain runs.
    private func submit(_ work: Work) {
        queued.add(1, ordering: .relaxed)
        let start = schedule.withLock { schedule in
            schedule.waiting.append(work)
            defer { schedule.draining = true }
            return !schedule.draining
        }
        if start { queue.asyncWriteWithoutTransaction { [self] db in drain(db) } }
    }

    /// Runs waiting work in order until none may run: with a transaction open, only its own.
    private func drain(_ db: Database) {
        while true {
            let next = schedule.withLock { schedule -> Work? in
                let index = schedule.owner == nil ? schedule.waiting.indices.first
                    : schedule.waiting.firstIndex { $0.transaction == schedule.owner }
                guard let index else {
                    schedule.draining = false
                    return nil
                }
                return schedule.waiting.remove(at: index)
            }
            guard let next else { return }
            let after = connection.withLock { connection in
                let after = next.run(db)
                recorder?.afterWork(connection.pointer)
                return after
            }
            // Before the completion: the caller's next request may find the store idle.
            queued.subtract(1, ordering: .relaxed)
            after()
        }
    }

    /// Runs `body` with the store, after the work already submitted.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            submit(Work(transaction: nil) { db in
                let result = Result { try body(db) }
                return { continuation.resume(with: result) }
            })
        }
    }

    /// Runs `body` with the store read-only (`PRAGMA query_only`), after the work already
    /// submitted. No transaction is needed for a consistent view: all work on the file is
    /// submitted here.
    public func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await write { db in try db.readOnly { try body(db) } }
    }

    /// Runs `body` with the store after the work already submitted, then hands its result to
    /// `completion` — without a task or a wait: the callback form of ``write(_:)``, for the
    /// event loops. With `transaction`, `body` is that transaction's work.
    public func enqueue<T: Sendable>(transaction: TransactionKey? = nil, _ body: @escaping @Sendable (Database) -> T,
                                     completion: @escaping @Sendable (T) -> Void) {
        submit(Work(transaction: transaction) { db in
            let result = body(db)
            return { completion(result) }
        })
    }

    /// Runs `body` on the calling thread, waiting for work in progress; for a store nobody
    /// else can reach yet (being opened), where a hop to the queue's thread would only add
    /// latency. Blocks: never call it on an event loop or the cooperative pool.
    package func writeBlocking<T: Sendable>(_ body: (Database) throws -> T) throws -> T {
        try connection.withLock { connection in
            defer { recorder?.afterWork(connection.pointer) }
            return try queue.inDatabase(body)
        }
    }

    /// Runs `body` right now on the calling thread with the raw connection when nothing is
    /// submitted, running or holding the store (a transaction), and returns nil without running
    /// it otherwise (it never waits).
    ///
    /// This is the request fast path: a point query on an idle store costs a few microseconds,
    /// while hopping to the queue's thread and back costs two thread wake-ups. Submitted work
    /// goes first (order is kept), and work submitted while `body` runs waits for it. The caller
    /// must keep `body` short and leave no transaction open. Once the store is closing, `body`
    /// never runs.
    public func runIfIdle<T>(_ body: (OpaquePointer) throws -> T) rethrows -> T? {
        guard queued.load(ordering: .relaxed) == 0 else { return nil }
        let ran = try connection.withLockIfAvailable { connection -> T? in
            connection.closed ? nil : try body(connection.pointer)
        }
        return ran ?? nil
    }

    /// Hands back the page cache of an idle store (its pages are read from the file again when
    /// it is used): `sqlite3_db_release_memory`. Returns the bytes the cache held before and
    /// after; nil when the store is busy or closing (nothing done). Needs no lease.
    public func releaseMemoryIfIdle() -> (before: Int, after: Int)? {
        runIfIdle { connection in
            let before = Self.cacheBytes(connection)
            sqlite3_db_release_memory(connection)
            return (before, Self.cacheBytes(connection))
        }
    }

    /// What the connection's page cache holds (`SQLITE_DBSTATUS_CACHE_USED`).
    private static func cacheBytes(_ connection: OpaquePointer) -> Int {
        var current: Int32 = 0, highest: Int32 = 0
        sqlite3_db_status(connection, SQLITE_DBSTATUS_CACHE_USED, &current, &highest, 0)
        return Int(current)
    }

    // MARK: Interactive transactions

    /// Opens transaction `key` (`BEGIN IMMEDIATE`, or `BEGIN DEFERRED`) in its turn; from then
    /// on only work of `key` runs until ``endTransaction(_:commit:completion:)``. `completion`
    /// gets SQLite's error, or nil when the transaction is open.
    public func beginTransaction(_ key: TransactionKey, immediate: Bool, completion: @escaping @Sendable (DatabaseError?) -> Void) {
        submit(Work(transaction: nil) { [self] db in
            do {
                try db.execute(sql: immediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED")
                schedule.withLock { $0.owner = key }
                queued.add(1, ordering: .relaxed) // held: nothing runs inline until the end
                return { completion(nil) }
            } catch {
                return { completion(error as? DatabaseError ?? DatabaseError(resultCode: .SQLITE_ERROR, message: "\(error)")) }
            }
        })
    }

    /// Commits (or rolls back) transaction `key` after its work already submitted, and lets the
    /// waiting work run. A commit that fails rolls back. `completion` gets the error, or nil.
    public func endTransaction(_ key: TransactionKey, commit: Bool, completion: @escaping @Sendable (DatabaseError?) -> Void) {
        submit(Work(transaction: key) { [self] db in
            var failure: DatabaseError?
            if db.isInsideTransaction {
                do {
                    if commit, let recorder {
                        do { try recorder.flush(db.sqliteConnection!) } catch { throw DatabaseError(resultCode: .SQLITE_ERROR, message: "change log: \((error as? ChangeLogError)?.message ?? "\(error)")") }
                    }
                    try db.execute(sql: commit ? "COMMIT" : "ROLLBACK")
                } catch {
                    failure = error as? DatabaseError
                    if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
                }
            }
            release(key)
            let outcome = failure
            return { completion(outcome) }
        })
    }

    /// Whether `key` still holds the store; false once SQLite itself ended the transaction (an
    /// interrupted write, a full disk), which also releases the store. Call from `key`'s work.
    public func transactionIsAlive(_ key: TransactionKey, _ db: Database) -> Bool {
        if db.isInsideTransaction { return true }
        release(key)
        return false
    }

    /// Keys of ``whileHeld(_:)``: from the top half of the range, which transaction keys (counted
    /// up from 1) never reach.
    private static let nextHoldKey = Atomic<UInt64>(1 << 63)

    /// Runs `body` while nothing else runs on the store: after the work already submitted, and
    /// before anything submitted meanwhile, which waits in order until `body` returns — like an
    /// interactive transaction, but without one, and without the connection: `body` runs off the
    /// store's queue (it may wait on another process without blocking that queue's thread). A
    /// replica check uses it to see the store unchanged between a sync and a read.
    ///
    /// The caller must keep the store open meanwhile (a registry lease).
    public func whileHeld<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T {
        let key = TransactionKey(Self.nextHoldKey.add(1, ordering: .relaxed).newValue)
        await withCheckedContinuation { (held: CheckedContinuation<Void, Never>) in
            submit(Work(transaction: nil) { [self] _ in
                schedule.withLock { $0.owner = key }
                queued.add(1, ordering: .relaxed) // held: nothing runs inline until the end
                return { held.resume() }
            })
        }
        // Released by work of its own, so that the drain goes on with what waited meanwhile.
        defer { submit(Work(transaction: key) { [self] _ in release(key); return {} }) }
        return try await body()
    }

    /// Ends `key`'s hold on the store (its transaction is over).
    private func release(_ key: TransactionKey) {
        let held = schedule.withLock { schedule -> Bool in
            guard schedule.owner == key else { return false }
            schedule.owner = nil
            return true
        }
        if held { queued.subtract(1, ordering: .relaxed) }
    }

    /// Notes a migration of the store for its watchers (a reset: the app re-reads), and
    /// returns its report. Call it from the work that migrated.
    @discardableResult
    public func migrated(_ report: MigrationReport) -> MigrationReport {
        if report.migrated { recorder?.requestReset() }
        return report
    }

    /// Waits for the work already submitted (blocking; on a ``BlockingPool`` thread).
    func finishQueuedWork() {
        queue.writeWithoutTransaction { _ in }
    }

    /// Makes ``close()`` leave the WAL as it is: a replicator that may still read it from where
    /// it stopped (it did not confirm it let go) must find every frame it has not read yet, and
    /// the next registration of a replicated store goes on from its position in it instead of
    /// shipping a snapshot. Call it when no work runs (the store is being closed).
    public func keepsWALOnClose() {
        queue.inDatabase { db in _ = userstore_keep_wal_on_close(db.sqliteConnection) }
    }

    /// Closes the connection after the work already submitted.
    func close() {
        let statements = self.statements, recorder = self.recorder
        queue.writeWithoutTransaction { _ in
            statements.finalizeAll()
            recorder?.finalize()
        }
        connection.withLock { $0.closed = true }
        try? queue.close()
    }
}

extension Store {
    /// The store's schema version (`PRAGMA user_version`), read in its turn.
    public func schemaVersion() async throws -> Int64 {
        try await read { db in try Bookkeeping.userVersion(db) }
    }

    /// The store's `app_version` row when the store is idle (read right here, without waiting);
    /// nil when it is busy or the row cannot be read (``versionInfo()`` then says why).
    public func versionInfoIfIdle() -> StoreVersionInfo? {
        guard let row = try? runIfIdle({ connection in try Bookkeeping.read(connection: connection) }) else { return nil }
        return row
    }

    /// The store's `app_version` row: read right here when the store is idle, else in its turn.
    public func versionInfo() async throws -> StoreVersionInfo {
        if let row = versionInfoIfIdle() { return row }
        return try await self.read { db in try self.versionInfo(db) }
    }

    /// The store's `app_version` row, read on its connection `db` (in the store's turn); throws
    /// `StoreDamaged` when the table is missing.
    public func versionInfo(_ db: Database) throws -> StoreVersionInfo {
        guard let row = try Bookkeeping.read(db) else { throw StoreError.storeDamaged(user: user, message: "the app_version table is missing") }
        return row
    }
}
