import CSyncFS
import Foundation

/// Group commit for a fleet run: makes everything written so far to the stores' file system
/// durable with one `syncfs(2)` shared by every caller waiting at the same time.
///
/// A fleet run writes thousands of small stores side by side. Synced one file at a time, each
/// store costs four fsyncs (its new WAL's header and folder, then the WAL and the database file
/// at the checkpoint), each a journal commit of its own. Here each store writes without fsync
/// and calls ``sync()`` twice — once before its checkpoint writes the database file, once after
/// — and one `syncfs` serves every store that asked while the previous one ran: on a journaled
/// ext4, SQLite alone migrates 1,330 stores/s this way against 770 with per-file fsyncs
/// (docs/performance.md). PostgreSQL offers the same trade for its start-up sync
/// (`recovery_init_sync_method = syncfs`): `syncfs` also writes back other programs' dirty data
/// on that file system, which `migrations.fleetSyncMethod: fsync` avoids.
///
/// The stores directory is taken to be one file system (the daemon owns its layout; nothing is
/// mounted inside it).
final class FileSystemSync: @unchecked Sendable { // all state is touched under `condition` only
    /// Why a sync failed: the file system reported a write-back error, or the directory could
    /// not be opened.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    private let directory: String
    private let syncFileSystem: @Sendable (Int32) -> Int32
    private let condition = NSCondition()
    private var descriptor: Int32 = -1
    /// Syncs started and finished so far; one runs at a time.
    private var started: UInt64 = 0
    private var finished: UInt64 = 0
    private var running = false
    /// The latest sync that failed, and why.
    private var failed: (sync: UInt64, failure: Failure)?
    /// Callers waiting for a sync someone else runs.
    private var waiting = 0

    /// `directory`: any folder on the file system to sync (the stores directory).
    /// `syncFileSystem`: `syncfs(2)`; tests pass one that lets them hold a sync half-way.
    init(directory: String, syncFileSystem: @escaping @Sendable (Int32) -> Int32 = { syncfs($0) }) {
        self.directory = directory
        self.syncFileSystem = syncFileSystem
    }

    /// Syncs run so far, and callers now waiting for one someone else runs (for tests).
    var statistics: (syncs: UInt64, waiting: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (finished, waiting)
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    /// Returns once a `syncfs` that started after this call has finished: everything the caller
    /// wrote before calling is then durable. Blocks the calling thread (a blocking-pool job).
    /// Throws if that sync, or a later one that finished meanwhile, reported an error: a
    /// write-back error is reported once per open file, so it must reach every store whose
    /// data it may have lost.
    func sync() throws(Failure) {
        condition.lock()
        defer { condition.unlock() }
        // A sync already under way may have started before the caller's writes: wait for the next.
        let needed = started + 1
        while finished < needed {
            if running {
                waiting += 1
                condition.wait()
                waiting -= 1
                continue
            }
            running = true
            started += 1
            let number = started
            condition.unlock()
            let failure = syncOnce()
            condition.lock()
            running = false
            finished = number
            if let failure { failed = (number, failure) }
            condition.broadcast()
        }
        if let failed, failed.sync >= needed { throw failed.failure }
    }

    /// One `syncfs` of the directory's file system; called without the lock held.
    private func syncOnce() -> Failure? {
        if descriptor < 0 {
            descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if descriptor < 0 { return Failure(description: "cannot open \(directory) to sync its file system: \(String(cString: strerror(errno)))") }
        }
        guard syncFileSystem(descriptor) == 0 else {
            return Failure(description: "syncfs of \(directory)'s file system failed: \(String(cString: strerror(errno)))")
        }
        return nil
    }
}
