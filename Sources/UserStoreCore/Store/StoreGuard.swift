import Foundation
import GRDBSQLite

/// Keeps client statements inside their own store and inside their time budget.
///
/// Installed once per connection (an authorizer change expires every prepared statement, so it
/// is never swapped), it is permissive by default — migrations and the daemon's bookkeeping need
/// everything — and strict only while ``withClientRules(deadline:_:)`` runs a client's
/// statement. Then it refuses: `ATTACH`/`DETACH`; changes to `app_version`,
/// `schema_migrations` and `user_version`; PRAGMAs that change settings; transaction control
/// (the API owns transactions; inside an interactive one, savepoints are allowed);
/// `load_extension`; virtual tables other than
/// FTS and R-Tree; and it interrupts a statement that runs past its deadline.
///
/// Thread-safety: SQLite calls the callbacks synchronously on the thread that prepares or steps
/// a statement, which always holds the store's connection (``Store``'s connection mutex): the
/// store's queue running submitted work, or an event loop running an inline read through
/// ``Store/runIfIdle(_:)``. All state is touched only by that holder, one at a time, and the
/// mutex orders one holder's writes before the next one's reads.
public final class StoreGuard: @unchecked Sendable {
    /// PRAGMAs a client may run with an argument because the argument only selects what to read.
    static let introspectionPragmas: Set<String> = [
        "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
        "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check",
    ]
    static let allowedModules: Set<String> = ["fts3", "fts4", "fts5", "rtree", "rtree_i32", "geopoly"]

    private var clientRules = false
    private var savepointsAllowed = false
    private var deadline: UInt64 = .max
    private var yieldAt: UInt64 = .max
    /// Why the last client statement was refused (for the error message).
    public private(set) var refusal: String?
    /// The last client statement ran out of time.
    public private(set) var timedOut = false
    /// The last client statement was given up (at its `yieldAt` time, or by ``yield()``) to be
    /// run again elsewhere.
    public private(set) var yielded = false

    public init() {}

    /// Runs `body` (which prepares and steps client statements) under the client rules.
    /// A statement still running at `deadline` is interrupted and ``timedOut`` set; one still
    /// running at `yieldAt` (earlier) is interrupted and ``yielded`` set, so that the caller
    /// can run it again where it may take its time.
    public func withClientRules<T>(deadline: UInt64, yieldAt: UInt64 = .max, savepoints: Bool = false, _ body: () throws -> T) rethrows -> T {
        clientRules = true
        savepointsAllowed = savepoints
        self.deadline = deadline
        self.yieldAt = yieldAt
        refusal = nil
        timedOut = false
        yielded = false
        defer {
            clientRules = false
            savepointsAllowed = false
            self.deadline = .max
            self.yieldAt = .max
        }
        return try body()
    }

    /// Whether a client's statement is running (its changes are the client's own, recorded for
    /// watchers; anything else changing rows is the daemon's work).
    public var runningClientStatement: Bool { clientRules }

    /// Runs `body` (the daemon's own statements amid a client's: its transaction control, the
    /// change log) with the client rules lifted, and puts them back after.
    public func withoutClientRules<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        let saved = clientRules
        clientRules = false
        defer { clientRules = saved }
        return try body()
    }

    /// Gives up the client statement being run, as if its `yieldAt` had passed (for one that
    /// must not run where it is, whatever its duration).
    public func yield() {
        yielded = true
    }

    /// Monotonic nanoseconds (a vDSO call, cheap beside the thousand VM steps between reads;
    /// the coarse clock's jiffy resolution would be too rough for ``withClientRules``' `yieldAt`).
    public static func now() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }

    /// Installs the callbacks on `connection`. The connection must not outlive `self`.
    func install(on connection: OpaquePointer) {
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_set_authorizer(connection, { context, action, first, second, _, _ in
            let guardian = Unmanaged<StoreGuard>.fromOpaque(context!).takeUnretainedValue()
            return guardian.authorize(action, first.map { String(cString: $0) }, second.map { String(cString: $0) })
        }, context)
        sqlite3_progress_handler(connection, 1000, { context in
            let guardian = Unmanaged<StoreGuard>.fromOpaque(context!).takeUnretainedValue()
            guard guardian.clientRules else { return 0 }
            let now = StoreGuard.now()
            if now > guardian.deadline {
                guardian.timedOut = true
                return 1
            }
            if now > guardian.yieldAt {
                guardian.yielded = true
                return 1
            }
            return 0
        }, context)
    }

    private func authorize(_ action: Int32, _ first: String?, _ second: String?) -> Int32 {
        guard clientRules else { return SQLITE_OK }
        switch action {
        case SQLITE_ATTACH, SQLITE_DETACH:
            return deny("ATTACH and DETACH are refused: a request reaches its own user's store only")
        case SQLITE_INSERT, SQLITE_UPDATE, SQLITE_DELETE, SQLITE_DROP_TABLE:
            if let table = first, Self.isBookkeeping(table) { return deny("\(table) is the daemon's bookkeeping and is read-only") }
        case SQLITE_ALTER_TABLE, SQLITE_CREATE_INDEX, SQLITE_DROP_INDEX, SQLITE_CREATE_TRIGGER, SQLITE_DROP_TRIGGER:
            if let table = second, Self.isBookkeeping(table) { return deny("\(table) is the daemon's bookkeeping and is read-only") }
        case SQLITE_CREATE_TEMP_TRIGGER:
            return deny("temporary triggers are refused")
        case SQLITE_PRAGMA:
            let name = (first ?? "").lowercased()
            if Self.introspectionPragmas.contains(name) || second == nil { return SQLITE_OK }
            return deny("PRAGMA \(name) cannot be changed by a request")
        case SQLITE_SAVEPOINT where savepointsAllowed:
            return SQLITE_OK
        case SQLITE_TRANSACTION, SQLITE_SAVEPOINT:
            return deny(savepointsAllowed ? "BEGIN, COMMIT and ROLLBACK belong to the API: use Commit or Rollback"
                                          : "transaction control is refused: use Begin/Commit, or Batch with transaction: true")
        case SQLITE_FUNCTION:
            if let name = second?.lowercased(), name == "load_extension" || name == "fts3_tokenizer" {
                return deny("\(name)() is refused")
            }
        case SQLITE_CREATE_VTABLE:
            if let module = second?.lowercased(), !Self.allowedModules.contains(module) {
                return deny("virtual table module \(module) is refused")
            }
        default:
            break
        }
        return SQLITE_OK
    }

    private func deny(_ reason: String) -> Int32 {
        refusal = reason
        return SQLITE_DENY
    }

    /// The daemon's own tables, and Litestream's in a replicated store (`_litestream_seq`,
    /// `_litestream_lock`: written by Litestream's own connection, never by clients).
    static func isBookkeeping(_ table: String) -> Bool {
        let name = table.lowercased()
        return Bookkeeping.tables.contains(name) || name.hasPrefix(Bookkeeping.replicatorPrefix)
    }
}
