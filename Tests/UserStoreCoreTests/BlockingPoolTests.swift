import Foundation
import Synchronization
import Testing
@testable import UserStoreCore

/// `BlockingPool.forEach`: every item once, at most `width` at a time, the first error thrown.
@Suite struct BlockingPoolTests {
    final class Counters: Sendable {
        let running = Mutex(0)
        let most = Mutex(0)
        let seen = Mutex<[Int]>([])
    }

    @Test func everyItemRunsOnceAtMostWidthAtATime() throws {
        let counters = Counters()
        try BlockingPool.forEach(Array(0..<64), width: 8) { item in
            let now = counters.running.withLock { running in
                running += 1
                return running
            }
            counters.most.withLock { $0 = max($0, now) }
            // Long enough for the other workers to be inside at once: it is what is counted.
            usleep(2_000)
            counters.running.withLock { $0 -= 1 }
            counters.seen.withLock { $0.append(item) }
        }
        #expect(counters.seen.withLock { $0 }.sorted() == Array(0..<64))
        let most = counters.most.withLock { $0 }
        #expect(most > 1 && most <= 8, "\(most) ran at once")
    }

    struct Refused: Error, Equatable { let item: Int }

    @Test func theFirstErrorIsThrownAndLaterItemsAreNotBegun() {
        let counters = Counters()
        #expect(throws: Refused(item: 3)) {
            try BlockingPool.forEach(Array(0..<1000), width: 1) { item in
                counters.seen.withLock { $0.append(item) }
                if item == 3 { throw Refused(item: item) }
            }
        }
        #expect(counters.seen.withLock { $0 } == [0, 1, 2, 3])
    }

    /// Every thread of the pool busy (blocked on something the caller will release only after):
    /// the caller does every item itself and returns — it never waits for helpers that could
    /// not start (the daemon's fence held a lock every pool thread queued on, and waited).
    @Test(.timeLimit(.minutes(1))) func aPoolWithNoThreadFreeStillFinishes() throws {
        let release = DispatchSemaphore(value: 0), occupied = DispatchSemaphore(value: 0)
        let pool = BlockingPool.shared
        for _ in 0..<pool.threads {
            pool.submit {
                occupied.signal()
                release.wait()
            }
        }
        for _ in 0..<pool.threads { occupied.wait() }
        let counters = Counters()
        let finished = DispatchSemaphore(value: 0)
        Thread {
            try? BlockingPool.forEach(Array(0..<16), width: 8) { item in counters.seen.withLock { $0.append(item) } }
            finished.signal()
        }.start()
        let done = finished.wait(timeout: .now() + 10) == .success
        for _ in 0..<pool.threads { release.signal() }
        #expect(done, "forEach waited for pool threads that could not start")
        #expect(counters.seen.withLock { $0 }.sorted() == Array(0..<16))
    }
}
