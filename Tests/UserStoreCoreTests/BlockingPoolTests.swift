import Foundation
import Synchronization
import Testing
@testable import UserStoreCore

/// The ways async work runs beside the blocking pool: `concurrentForEach` (every item once, at
/// most `width` at a time, the first error thrown) and `BlockingPool.executing` (on the pool's
/// threads, not the cooperative pool's).
@Suite struct BlockingPoolTests {
    final class Counters: Sendable {
        let running = Mutex(0)
        let most = Mutex(0)
        let seen = Mutex<[Int]>([])

        /// Counts one more at work for `duration`, keeping the most seen at once.
        func work(_ item: Int, for duration: Duration) async throws {
            let now = running.withLock { running in
                running += 1
                return running
            }
            most.withLock { $0 = max($0, now) }
            try await Task.sleep(for: duration)
            running.withLock { $0 -= 1 }
            seen.withLock { $0.append(item) }
        }
    }

    @Test func everyItemRunsOnceAtMostWidthAtATime() async throws {
        let counters = Counters()
        // Long enough for the other workers to be inside at once: it is what is counted.
        try await Array(0..<64).concurrentForEach(width: 8) { item in try await counters.work(item, for: .milliseconds(2)) }
        #expect(counters.seen.withLock { $0 }.sorted() == Array(0..<64))
        let most = counters.most.withLock { $0 }
        #expect(most > 1 && most <= 8, "\(most) ran at once")
    }

    struct Refused: Error, Equatable { let item: Int }

    @Test func theFirstErrorIsThrownAndLaterItemsAreNotBegun() async {
        let counters = Counters()
        await #expect(throws: Refused(item: 3)) {
            try await Array(0..<1000).concurrentForEach(width: 1) { item in
                counters.seen.withLock { $0.append(item) }
                if item == 3 { throw Refused(item: item) }
            }
        }
        #expect(counters.seen.withLock { $0 } == [0, 1, 2, 3])
    }

    /// An error of an item still under way when the last item was begun is thrown too (a task
    /// group drops what it awaits on its own).
    @Test func anErrorOfTheLastItemsIsThrown() async {
        await #expect(throws: Refused(item: 9)) {
            try await Array(0..<10).concurrentForEach(width: 4) { item in
                if item == 9 { throw Refused(item: item) }
            }
        }
    }

    @Test func workExecutingOnThePoolRunsOnItsThreadsAcrossAwaits() async throws {
        #expect(BlockingPool.current == nil)
        let onPool = await BlockingPool.executing { () async -> [Bool] in
            var onPool = [BlockingPool.current === BlockingPool.shared]
            for _ in 0..<3 {
                try? await Task.sleep(for: .milliseconds(1))
                onPool.append(BlockingPool.current === BlockingPool.shared)
            }
            return onPool
        }
        #expect(onPool == [true, true, true, true])
        let onWaitThreads = await BlockingPool.executingUrgently { () async -> [Bool] in
            var onWaitThreads = [BlockingPool.current === BlockingPool.waiting]
            try? await Task.sleep(for: .milliseconds(1))
            onWaitThreads.append(BlockingPool.current === BlockingPool.waiting)
            return onWaitThreads
        }
        #expect(onWaitThreads == [true, true])
    }
}

/// `AsyncLock`: shared holders together, an exclusive one alone, first come first served.
@Suite struct AsyncLockTests {
    /// Holders at once, and the most seen.
    final class Inside: Sendable {
        let now = Mutex(0)
        let most = Mutex(0)

        func hold(for duration: Duration) async {
            let count = now.withLock { now in
                now += 1
                return now
            }
            most.withLock { $0 = max($0, count) }
            try? await Task.sleep(for: duration)
            now.withLock { $0 -= 1 }
        }
    }

    @Test func sharedHoldersOverlapAndExclusiveOnesNever() async {
        let lock = AsyncLock()
        let shared = Inside(), exclusive = Inside()
        // On the pool's threads (the group's tasks too), like the next test.
        await BlockingPool.executing {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<8 { group.addTask { await lock.shared { await shared.hold(for: .milliseconds(20)) } } }
            }
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<8 { group.addTask { await lock.exclusive { await exclusive.hold(for: .milliseconds(2)) } } }
            }
        }
        #expect(shared.most.withLock { $0 } > 1, "shared holders ran one at a time")
        #expect(exclusive.most.withLock { $0 } == 1, "exclusive holders overlapped")
    }

    final class Order: Sendable {
        let list = Mutex<[String]>([])
    }

    /// Fewer callers than expected came to wait for the lock (the others got it at once).
    struct NotWaiting: Error {
        let waiting: Int
        let expected: Int
    }

    /// Waits (at most 10 s) until `count` callers wait for `lock`.
    static func waitUntil(_ lock: AsyncLock, hasWaiting count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while lock.waiting < count {
            guard ContinuousClock.now < deadline else { throw NotWaiting(waiting: lock.waiting, expected: count) }
            await Task.yield()
        }
    }

    /// A writer that waits is not overtaken by readers that come after it (the fold is never
    /// starved by a stream of restores), and those readers wait for it. On the pool's threads:
    /// Swift's cooperative pool is held by the synchronous suites running beside (CI saw this
    /// test wait 172 s for it).
    @Test(.timeLimit(.minutes(1))) func aWaitingWriterGoesBeforeLaterReaders() async throws {
        try await BlockingPool.executing {
            let lock = AsyncLock()
            let order = Order()
            let (entered, inside) = AsyncStream.makeStream(of: Void.self)
            let (release, releaser) = AsyncStream.makeStream(of: Void.self)
            let first = Task(executorPreference: BlockingPool.shared) {
                await lock.shared {
                    order.list.withLock { $0.append("reader 1") }
                    inside.yield()
                    for await _ in release { break }
                }
            }
            for await _ in entered { break }
            let writer = Task(executorPreference: BlockingPool.shared) { await lock.exclusive { order.list.withLock { $0.append("writer") } } }
            try await Self.waitUntil(lock, hasWaiting: 1)
            let second = Task(executorPreference: BlockingPool.shared) { await lock.shared { order.list.withLock { $0.append("reader 2") } } }
            try await Self.waitUntil(lock, hasWaiting: 2)
            releaser.yield()
            await first.value
            await writer.value
            await second.value
            #expect(order.list.withLock { $0 } == ["reader 1", "writer", "reader 2"])
        }
    }
}
