import Foundation

/// A readers–writer lock (POSIX `pthread_rwlock_t`): restores read the log's objects together;
/// the fold and the erase, which delete them, run alone. Held by blocking-pool threads only.
package final class ReadWriteLock: @unchecked Sendable { // the lock is its own synchronisation
    private let lock = UnsafeMutablePointer<pthread_rwlock_t>.allocate(capacity: 1)

    package init() {
        pthread_rwlock_init(lock, nil)
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    /// Runs `body` while no writer holds the lock (other readers may).
    package func reading<T>(_ body: () throws -> T) rethrows -> T {
        pthread_rwlock_rdlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    /// Runs `body` alone.
    package func writing<T>(_ body: () throws -> T) rethrows -> T {
        pthread_rwlock_wrlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }
}
