import CSyncFS
import Foundation

/// Group commit for a fleet run: makes everything written so far to the data directory's file
/// system durable with one `syncfs(2)` shared by every caller waiting at the same time.
///
/// A fleet run writes thousands of small stores side by side. Synced one file at a time, each
/// store costs four fsyncs (its new WAL's header and folder, then the WAL and the database file
/// at the checkpoint), each a journal commit of its own. Here each store writes without fsync
/// and calls ``sync(since:)`` twice — once before its checkpoint writes the database file, once
/// after — and one `syncfs` serves every store that asked while the previous one ran: on a
/// journaled ext4 (2 cores, 10,000 stores) the daemon migrates 708 stores/s this way against
/// 501 with per-file fsyncs, and SQLite alone 1,079 against 790 (docs/dev/performance-log.md).
/// PostgreSQL offers the same trade for its start-up sync (`recovery_init_sync_method =
/// syncfs`): `syncfs` also writes back other programs' dirty data on that file system, which
/// `migrations.fleetSyncMethod: fsync` avoids.
///
/// A store on another file system than the data directory's (a folder mounted inside it) is
/// not covered: the registry asks ``covers(_:)`` per store and syncs such stores file by file.
/// `syncfs` reports write-back errors only since Linux 5.8
/// (``reportsWriteBackErrors``); the registry syncs file by file on older kernels.
final class FileSystemSync: @unchecked Sendable { // the counters are touched under `condition` only
    /// Why a sync failed: the file system reported a write-back error, or the directory could
    /// not be opened.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// How many syncs had failed when a caller began writing (``mark()``).
    struct Mark: Sendable { fileprivate let failures: UInt64 }

    private let directory: String
    private let syncFileSystem: @Sendable (Int32) -> Int32
    /// Opened once, at creation: a write-back error is reported to the descriptors open when
    /// it happened, so one opened later could miss it. Only the caller running a sync uses it.
    private let descriptor: Int32
    private let openFailure: Failure?
    /// The file system `descriptor` is on; nil when it could not be opened.
    private let device: dev_t?
    private let condition = NSCondition()
    /// Syncs started and finished so far; one runs at a time.
    private var started: UInt64 = 0
    private var finished: UInt64 = 0
    private var running = false
    /// Syncs that reported an error, and the latest one's.
    private var failures: UInt64 = 0
    private var lastFailure: Failure?
    /// Callers waiting for a sync someone else runs.
    private var waiting = 0

    /// `directory`: any folder on the file system to sync (the data directory).
    /// `syncFileSystem`: `syncfs(2)`; tests pass one that lets them hold a sync half-way or fail it.
    init(directory: String, syncFileSystem: @escaping @Sendable (Int32) -> Int32 = { syncfs($0) }) {
        self.directory = directory
        self.syncFileSystem = syncFileSystem
        descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        openFailure = descriptor < 0
            ? Failure(description: "cannot open \(directory) to sync its file system: \(String(cString: strerror(errno)))") : nil
        var status = stat()
        device = descriptor >= 0 && fstat(descriptor, &status) == 0 ? status.st_dev : nil
    }

    /// Whether a `syncfs` here makes `path` durable: whether it — or, while it does not exist
    /// yet, its nearest existing folder — is on this file system. A folder someone mounted
    /// inside the data directory is not; its stores are then synced file by file. True when
    /// the directory could not be opened (every sync fails then anyway).
    func covers(_ path: String) -> Bool {
        guard let device else { return true }
        var candidate = path
        var status = stat()
        while stat(candidate, &status) != 0 {
            guard errno == ENOENT, let slash = candidate.lastIndex(of: "/"), slash > candidate.startIndex else { return false }
            candidate = String(candidate[..<slash])
        }
        return status.st_dev == device
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    /// Whether this kernel's `syncfs` reports write-back errors (Linux 5.8 and later).
    /// (Foundation's operating-system version is the kernel's release on Linux.)
    static let reportsWriteBackErrors = ProcessInfo.processInfo.isOperatingSystemAtLeast(
        OperatingSystemVersion(majorVersion: 5, minorVersion: 8, patchVersion: 0))

    /// Taken before a caller's first unsynced write: ``sync(since:)`` then fails if any sync
    /// failed after it.
    func mark() -> Mark {
        condition.lock()
        defer { condition.unlock() }
        return Mark(failures: failures)
    }

    /// Returns once a `syncfs` that started after this call has finished: everything the caller
    /// wrote before calling is then durable. Blocks the calling thread (a blocking-pool job).
    /// Throws if any sync finished since `mark` reported an error — the one waited for or an
    /// earlier one: a write-back error is reported once, to whichever sync runs next, whoever's
    /// data it was, so every caller that had written meanwhile must take it as its own.
    func sync(since mark: Mark) throws(Failure) {
        if let openFailure { throw openFailure }
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
            let result = syncFileSystem(descriptor)
            let error = errno
            condition.lock()
            running = false
            finished = number
            if result != 0 {
                failures += 1
                lastFailure = Failure(description: "syncfs of \(directory)'s file system failed: \(String(cString: strerror(error)))")
            }
            condition.broadcast()
        }
        if failures > mark.failures, let lastFailure { throw lastFailure }
    }

    /// Syncs run so far, and callers now waiting for one someone else runs (for tests).
    var statistics: (syncs: UInt64, waiting: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (finished, waiting)
    }
}
