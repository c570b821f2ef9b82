import GRDBSQLite
import Synchronization

/// SQLite's WAL hook on a replicated store's connection: it flags every commit for the
/// replicator's sync pass and, while Litestream does not replicate the store, checkpoints it.
///
/// One hook does both because SQLite keeps one WAL hook per connection, and its automatic
/// checkpoints (`PRAGMA wal_autocheckpoint`) are that hook too: setting the pragma would
/// replace this one. Replicated stores therefore never use the pragma.
public final class WALHook: Sendable {
    /// WAL size, in pages, past which a store that checkpoints itself does so (SQLite's own
    /// default for automatic checkpoints).
    public static let checkpointPages: Int32 = 1000

    private let committed = Atomic<Bool>(false)
    private let selfCheckpointing = Atomic<Bool>(false)
    /// Reads each commit's pages for the daemon's own replication (nil: nobody does).
    private let captureSlot = Mutex<WALCapture?>(nil)
    /// The daemon's own replication's say on checkpoints: whether the WAL may be emptied now
    /// (every captured commit is in the replica), what to do once it was, and what to do when
    /// it is past the bound but may not be emptied yet.
    private let checkpointPolicy = Mutex<CheckpointPolicy?>(nil)

    private struct CheckpointPolicy {
        let may: @Sendable () -> Bool
        let done: @Sendable () -> Void
        let later: @Sendable () -> Void
    }

    public init() {}

    /// With the daemon's own replication: the store checkpoints itself (past ``checkpointPages``)
    /// when `may` says so, and `done` runs after each of its checkpoints (``checkpointsItself`` is
    /// then not consulted). When `may` says no — right after a commit its record is rarely in the
    /// replica yet — `later` runs instead (on the connection: it must not block), so that the
    /// replication can checkpoint once the record is stored; else a store written without pause
    /// would never empty its WAL.
    public func checkpoints(when may: @escaping @Sendable () -> Bool, then done: @escaping @Sendable () -> Void,
                            otherwise later: @escaping @Sendable () -> Void) {
        checkpointPolicy.withLock { $0 = CheckpointPolicy(may: may, done: done, later: later) }
    }

    /// The capture each commit is handed to, first (before any checkpoint of the hook's own
    /// could move its frames); set before anything writes to the store.
    public var capture: WALCapture? {
        get { captureSlot.withLock { $0 } }
        set { captureSlot.withLock { $0 = newValue } }
    }

    /// Installs the hook on `connection`. The WAL hook runs once a transaction's frames are in
    /// the WAL (a commit hook runs before them, and a sync that took the flag in between would
    /// miss the commit). The hook must outlive the connection.
    public func install(on connection: OpaquePointer) {
        sqlite3_wal_hook(connection, { context, connection, schema, pages in
            let hook = Unmanaged<WALHook>.fromOpaque(context!).takeUnretainedValue()
            hook.capture?.committed(frames: pages)
            hook.committed.store(true, ordering: .relaxed)
            if pages >= WALHook.checkpointPages, let policy = hook.checkpointPolicy.withLock({ $0 }) {
                if !policy.may() {
                    policy.later()
                } else if sqlite3_wal_checkpoint_v2(connection, schema, SQLITE_CHECKPOINT_TRUNCATE, nil, nil) == SQLITE_OK {
                    policy.done()
                }
            } else if pages >= WALHook.checkpointPages, hook.selfCheckpointing.load(ordering: .relaxed) {
                // TRUNCATE, not the PASSIVE checkpoint SQLite's automatic ones run: a PASSIVE
                // one lets the next commit restart the WAL from its start, over old frames.
                // Litestream, registering the store again, then finds its last frame still in
                // place, takes the new frames for the next ones and never ships those this
                // checkpoint moved into the database (they went missing from the replica). A
                // WAL emptied to zero bytes cannot be mistaken: its last frame is gone or
                // carries a new salt, and Litestream takes a full snapshot. The hook runs after
                // the commit released its locks, where SQLite allows a checkpoint; one that
                // fails (busy) is tried again at the next commit.
                _ = sqlite3_wal_checkpoint_v2(connection, schema, SQLITE_CHECKPOINT_TRUNCATE, nil, nil)
            }
            return SQLITE_OK
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Whether the store checkpoints itself (past ``checkpointPages``): set while Litestream
    /// does not replicate it (nobody else would, and the WAL would grow without end), cleared
    /// before it is registered (Litestream checkpoints registered stores, in step with what it
    /// has shipped).
    public var checkpointsItself: Bool {
        get { selfCheckpointing.load(ordering: .relaxed) }
        set { selfCheckpointing.store(newValue, ordering: .relaxed) }
    }

    /// Whether a commit happened since the last call (and clears the flag).
    public func take() -> Bool { committed.exchange(false, ordering: .relaxed) }

    /// Sets the flag again (a sync that failed must be tried on the next pass).
    public func restore() { committed.store(true, ordering: .relaxed) }
}
