import Foundation
import Synchronization

/// Threads for work that blocks on the disk: opening, migrating, copying and closing stores.
///
/// GCD's global queues on Linux run about one job per core and add no thread while a job
/// waits in `fsync`, so a fleet migration asked to work on 8 stores at once on 2 cores
/// migrated 2 at a time and left the cores idle during every sync (241 stores/s at
/// parallelism 2 and 298 at 8 with GCD on a journaled ext4). Jobs here run first come, first
/// served on a fixed set of threads started with the pool.
public final class BlockingPool: @unchecked Sendable { // `jobs` and `head` are only touched under `condition`
    /// The daemon's pool: 16 threads per core and 16 more, at least 48 and at most 128 — a fleet
    /// run at its default parallelism (16 per core, at most 64) plus room for the stores
    /// requests open meanwhile, so that a fleet run never makes them wait for a thread.
    static let shared = BlockingPool(threads: min(128, max(48, 16 * ProcessInfo.processInfo.activeProcessorCount + 16)))

    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []
    private var head = 0

    init(threads: Int) {
        for index in 0..<threads {
            let thread = Thread { [unowned self] in self.work() }
            thread.name = "userstore-io-\(index)"
            thread.start()
        }
    }

    /// Runs `work` on one of the daemon's pool's threads and returns what it returned: for work
    /// that blocks on the disk or waits for another process, off the cooperative pool.
    public static func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            shared.submit { continuation.resume(with: Result { try work() }) }
        }
    }

    /// Runs `body` for each of `items`, at most `width` at a time (on the calling thread and on
    /// the pool's), and returns once every one has; throws the first error (items not begun by
    /// then are not). For blocking I/O, such as requests to the replica, that would otherwise wait
    /// for each other. The calling thread takes items too, so a pool with no thread free still
    /// finishes.
    public static func forEach<T: Sendable>(_ items: [T], width: Int, _ body: @escaping @Sendable (T) throws -> Void) throws {
        let progress = ForEachProgress()
        let work: @Sendable () -> Void = {
            while progress.failure.withLock({ $0 == nil }) {
                let index = progress.next.withLock { next in
                    defer { next += 1 }
                    return next
                }
                guard index < items.count else { return }
                do {
                    try body(items[index])
                } catch {
                    progress.failure.withLock { if $0 == nil { $0 = error } }
                }
            }
        }
        let group = DispatchGroup()
        for _ in 0..<max(0, min(width, items.count) - 1) {
            group.enter()
            shared.submit {
                work()
                group.leave()
            }
        }
        work()
        group.wait()
        if let error = progress.failure.withLock({ $0 }) { throw error }
    }

    /// Runs `job` on one of the pool's threads.
    func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func work() {
        while true {
            condition.lock()
            while head == jobs.count { condition.wait() }
            let job = jobs[head]
            head += 1
            if head == jobs.count { jobs.removeAll(keepingCapacity: true); head = 0 }
            condition.unlock()
            job()
        }
    }
}

/// Where a ``BlockingPool/forEach(_:width:_:)`` stands: the next item, and the first failure.
private final class ForEachProgress: Sendable {
    let next = Mutex(0)
    let failure = Mutex<(any Error)?>(nil)
}
