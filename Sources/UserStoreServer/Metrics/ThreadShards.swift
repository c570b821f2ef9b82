import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A value kept once per recording thread and merged when read, so that the event loops record
/// every call without taking each other's lock. With one shared lock, two loops recording a
/// call each made the metrics cost 11–15% of point-query throughput (docs/dev/performance-log.md):
/// most of it waiting on the lock and its futex, not the recording itself.
///
/// Each thread records into the shard of its ``ThreadNumber``; more threads than shards share
/// them round robin, which costs only contention, never a count.
final class ThreadShards<Value: Sendable>: Sendable {
    private final class Shard: Sendable {
        let value: Mutex<Value>
        init(_ value: sending Value) { self.value = Mutex(value) }
    }

    private let shards: [Shard]

    /// `count` shards, each starting as `make()`; 8 covers a loop per core of a small host
    /// and the threads of the cooperative pool.
    init(count: Int = 8, _ make: () -> Value) {
        shards = (0..<max(1, count)).map { _ in Shard(make()) }
    }

    /// Updates the calling thread's shard.
    func record(_ update: (inout Value) -> Void) {
        shards[ThreadNumber.current % shards.count].value.withLock { update(&$0) }
    }

    /// A copy of every shard (each read under its own lock).
    var all: [Value] {
        shards.map { shard in shard.value.withLock { $0 } }
    }
}

/// The calling thread's number: 0, 1, 2, … in the order threads first ask, kept in a
/// thread-specific key (a load, once set).
enum ThreadNumber {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
        return key
    }()
    private static let next = Atomic<Int>(0)

    static var current: Int {
        // Stored plus one: a thread that never asked reads nil.
        if let stored = pthread_getspecific(key) { return Int(bitPattern: stored) - 1 }
        let number = next.add(1, ordering: .relaxed).oldValue
        pthread_setspecific(key, UnsafeRawPointer(bitPattern: number + 1))
        return number
    }
}
