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
    static let shared = BlockingPool(threads: min(128, max(48, 16 * ProcessInfo.processInfo.activeProcessorCount + 16)), name: "userstore-io")

    /// Two threads, whatever the cores, that run no disk work: for the async work that must not
    /// queue behind a backlog of opens and fsyncs (``executingUrgently(_:)``).
    static let waiting = BlockingPool(threads: 2, name: "userstore-wait")

    /// Each pool thread's pool, in a thread-specific slot. (Not the thread's name: on Linux the
    /// runtime renames a thread that runs tasks after its dispatch queue.)
    private static let threadKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    /// The pool whose thread this is; nil on any other thread. (Pools live as long as the
    /// process: their threads never end.)
    static var current: BlockingPool? {
        pthread_getspecific(threadKey).map { Unmanaged<BlockingPool>.fromOpaque($0).takeUnretainedValue() }
    }

    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []
    private var head = 0
    /// How many threads it runs.
    let threads: Int

    init(threads: Int, name: String) {
        self.threads = threads
        for index in 0..<threads {
            let thread = Thread { [unowned self] in self.work() }
            thread.name = "\(name)-\(index)"
            thread.start()
        }
    }

    /// Runs `work` on one of the daemon's pool's threads and returns what it returned (or
    /// throws what it threw: work that cannot fail makes a call that cannot either): for work
    /// that blocks on the disk or waits for another process, off the cooperative pool.
    /// Already on one of them (async work ``executing(_:)`` on the pool), it runs in place:
    /// another job would only queue the same thread's work behind the pool's backlog.
    public static func run<T: Sendable, Failure: Error>(_ work: @escaping @Sendable () throws(Failure) -> T) async throws(Failure) -> T {
        if current === shared { return try work() }
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, Failure>, Never>) in
            shared.submit { continuation.resume(returning: Result { () throws(Failure) -> T in try work() }) }
        }
        return try result.get()
    }

    /// Runs the async `work` with the daemon's pool as its executor: whatever it does between
    /// its awaits — decoding, compressing, a short file operation — runs on the pool's threads,
    /// never on Swift's cooperative pool (one thread per core, shared with everything else
    /// async, and in a test process with synchronous tests that hold its threads). For the
    /// replica's background work and the lease's rounds, which must neither wait for that pool
    /// nor hold it.
    public static func executing<T: Sendable>(_ work: @Sendable () async throws -> T) async rethrows -> T {
        try await withTaskExecutorPreference(shared, operation: work)
    }

    /// Runs the async `work` with the two threads of ``waiting`` as its executor, which run no
    /// disk work: what must not queue behind a backlog of opens and fsyncs on the daemon's pool
    /// (the writer lease's rounds, whose renewals durable writes depend on). `work` must not
    /// block: what touches the disk it hands to ``run(_:)``.
    public static func executingUrgently<T: Sendable>(_ work: @Sendable () async throws -> T) async rethrows -> T {
        try await withTaskExecutorPreference(waiting, operation: work)
    }

    /// Runs `job` on one of the pool's threads.
    func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func work() {
        pthread_setspecific(Self.threadKey, Unmanaged.passUnretained(self).toOpaque())
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

/// A pool runs tasks too (``BlockingPool/executing(_:)``, ``BlockingPool/executingUrgently(_:)``):
/// each job on one of its threads.
extension BlockingPool: TaskExecutor {
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        submit { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
