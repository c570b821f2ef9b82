import Foundation
import Synchronization
import Testing
@testable import UserStoreReplication

/// ``SyncLanes``: one sync of a store at a time, and callers that arrive while one runs share
/// the next (group commit).
@Suite struct SyncLanesTests {
    /// A sync that runs until it is let go, and records how many ran at once.
    final class Gate: Sendable {
        let (started, startedContinuation) = AsyncStream<Int>.makeStream()
        let (release, releaseContinuation) = AsyncStream<Void>.makeStream()
        let running = Mutex((now: 0, most: 0, count: 0))

        func sync() async -> Int {
            let number = running.withLock { state in
                state.now += 1
                state.most = max(state.most, state.now)
                state.count += 1
                return state.count
            }
            startedContinuation.yield(number)
            var iterator = release.makeAsyncIterator()
            _ = await iterator.next()
            running.withLock { $0.now -= 1 }
            return number
        }
    }

    @Test func callersWhileASyncRunsShareTheNextAndNoneOverlap() async throws {
        let lanes = SyncLanes<Int>(), gate = Gate()
        let deadline = ContinuousClock.now + .seconds(600)
        var started = gate.started.makeAsyncIterator()
        let first = Task { try await lanes.run("/a", until: deadline) { await gate.sync() } }
        #expect(await started.next() == 1)
        // Ten callers while the first runs: they queue one sync and share it.
        let waiting = (0..<10).map { _ in lanes.enqueue("/a", until: deadline) { await gate.sync() } }
        // Another store is not held up by this one.
        let other = Task { try await lanes.run("/b", until: deadline) { 42 } }
        #expect(try await other.value == 42)
        guard lanes.counts == .init(started: 2, joined: 9) else { // the first of /a, and /b's
            Issue.record("ten callers behind a running sync: \(lanes.counts)")
            for _ in 0..<12 { gate.releaseContinuation.yield() } // let every queued sync end
            return
        }
        gate.releaseContinuation.yield()
        #expect(try await first.value == 1)
        #expect(await started.next() == 2)
        // Started: a caller now queues a third sync rather than joining one that may have read
        // the WAL before its commit.
        let late = lanes.enqueue("/a", until: deadline) { await gate.sync() }
        gate.releaseContinuation.yield()
        for task in waiting { #expect(try await task.value == 2) }
        #expect(await started.next() == 3)
        gate.releaseContinuation.yield()
        #expect(try await late.value == 3)
        #expect(gate.running.withLock { $0.most } == 1)
        #expect(lanes.counts == .init(started: 4, joined: 9))
    }

    @Test func aSyncQueuedPastItsDeadlineNeverRuns() async throws {
        let lanes = SyncLanes<Int>(), gate = Gate()
        var started = gate.started.makeAsyncIterator()
        let first = Task { try await lanes.run("/a", until: .now + .seconds(600)) { await gate.sync() } }
        _ = await started.next()
        let expired = lanes.enqueue("/a", until: .now) { await gate.sync() }
        gate.releaseContinuation.yield()
        _ = try await first.value
        await #expect(throws: SyncLanes<Int>.Expired.self) { try await expired.value }
        #expect(gate.running.withLock { $0.count } == 1)
    }
}
