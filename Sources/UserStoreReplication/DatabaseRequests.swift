import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Synchronization

/// A database's `/register` and `/unregister` go to Litestream one at a time — each counted
/// until Litestream answers it, not until the caller stops waiting (docs/replication.md, the
/// durable rule, 4).
///
/// **Why.** A request the daemon gave up on is not gone: a paused or slow Litestream reads it
/// later and acts on it. Such a stale `/unregister` removes the database from Litestream's list
/// at once but closes it (a final sync, an upload) only afterwards; a `/register` of the same file
/// arriving meanwhile opens a second replicator of it, and the two write the same LTX files —
/// seen as a replica that no longer restores (`file checksum mismatch`) after a store was evicted
/// while Litestream was paused. A stale `/register` read after the `/unregister` that followed
/// it would leave Litestream holding a store the daemon believes let go of (the WAL rule).
/// (`/sync`s are not queued here: Litestream runs the syncs of one database object one at a
/// time, and one that finds no database fails harmlessly.)
///
/// **How.** A request for a database is sent only when every earlier one for it has been
/// answered (or its connection failed: that Litestream ended). The caller waits until its own
/// deadline; past it, the request already sent stays in flight and keeps the database's turn,
/// and one still queued is dropped without being sent. A Litestream that never answers holds
/// its databases until it is killed (``ReplicationMonitor`` does, in child mode).
package final class DatabaseRequests: Sendable {
    private struct Turn {
        /// Ends when the last request queued for the database has been answered or dropped.
        let done: EventLoopFuture<Void>
        /// Tells the last request apart from earlier ones: only the last removes the entry.
        let number: UInt64
    }

    private let turns = Mutex<[String: Turn]>([:])
    private let numbers = Atomic<UInt64>(0)
    private let group: any EventLoopGroup

    package init(group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.group = group
    }

    /// A request that was never sent: an earlier one for the database was still unanswered at
    /// its deadline.
    package struct StillUnanswered: Error, CustomStringConvertible {
        let route: String
        package var description: String {
            "not sent: Litestream had not yet answered an earlier request for this database (\(route) waited for it until its deadline)"
        }
    }

    /// The caller's deadline passed while its request was in flight (it stays in flight).
    package struct NotAnswered: Error {}

    /// How many databases have a request in flight or queued.
    package var busy: Int { turns.withLock { $0.count } }

    /// Sends `request` for the database `key` once every earlier request for it has been
    /// answered; the returned future ends with the answer, or fails at `deadline` with
    /// ``NotAnswered`` (sent) or ``StillUnanswered`` (never sent).
    package func send<Reply: Sendable>(_ key: String, route: String, until deadline: NIODeadline,
                               _ request: @escaping @Sendable () -> EventLoopFuture<Reply>) -> EventLoopFuture<Reply> {
        let loop = group.any()
        let answer = loop.makePromise(of: Reply.self)
        let finished = loop.makePromise(of: Void.self)
        let number = numbers.add(1, ordering: .relaxed).newValue
        let previous = turns.withLock { turns -> EventLoopFuture<Void>? in
            defer { turns[key] = Turn(done: finished.futureResult, number: number) }
            return turns[key]?.done
        }
        let finish: @Sendable () -> Void = {
            self.turns.withLock { turns in
                if turns[key]?.number == number { turns[key] = nil }
            }
            finished.succeed(())
        }
        // Both run on `loop`, one after the other: the turn either comes before the deadline
        // (sent) or after it (dropped), and the deadline's failure says which.
        let sent = NIOLockedValueBox(false)
        (previous ?? loop.makeSucceededVoidFuture()).hop(to: loop).whenComplete { _ in
            guard NIODeadline.now() < deadline else {
                finish()
                return
            }
            sent.withLockedValue { $0 = true }
            request().hop(to: loop).whenComplete { result in
                answer.completeWith(result) // ignored when the deadline came first
                finish()
            }
        }
        let timer = loop.scheduleTask(deadline: deadline) {
            answer.fail(sent.withLockedValue { $0 } ? NotAnswered() as any Error : StillUnanswered(route: route))
        }
        answer.futureResult.whenComplete { _ in timer.cancel() }
        return answer.futureResult
    }
}
