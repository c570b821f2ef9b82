import GRDB
import UserStoreConfiguration
import UserStoreCore
import Varlink

/// Answers the calls that make up nearly all traffic on the connection's event loop, inside the
/// channel handler: no task, no executor hop, no allocation beyond the reply.
///
/// A `Query` or `Execute` of a read-only statement, and an `Open`, on a store that is open, up
/// to date and idle run right here (the statement for up to
/// ``SQLRunner/inlineBudgetNanoseconds``). A statement that writes, one that ran out of its
/// inline budget, a `Batch`, and anything for a store with work queued go to the store's
/// serial queue with ``Store/enqueue(_:completion:)``; the reply comes back to the event loop
/// through a ``QueuedReply``. Everything else — a store to open or migrate, a failed store,
/// `Admin` and `org.varlink.service` calls, any error the full handlers would name — returns
/// ``Outcome/slow`` before anything ran, and the connection runs the ``RequestRouter`` instead.
struct FastPath {
    let context: DaemonContext

    enum Outcome {
        /// The reply is in the writer.
        case answered
        /// The call went to its store's queue; the ``QueuedReply`` it was given delivers the reply.
        case queued
        /// Nothing ran: the full handler takes the call.
        case slow
    }

    private enum Method { case open, query, execute, batch }

    /// Handles the call in `view` (a parsed message) from `peer`, appending its reply to
    /// `writer`, or queueing it with a ``QueuedReply`` from `makeQueuedReply`.
    func handle(_ view: JSONView, peer: PeerIdentity, limits: RequestLimits, into writer: inout JSONWriter,
                makeQueuedReply: () -> QueuedReply) -> Outcome {
        guard view.kind(0) == .object, let methodToken = view.member("method", of: 0),
              let method = Self.method(view, methodToken),
              let call = view.member("parameters", of: 0), view.kind(call) == .object,
              view.member("oneway", of: 0).flatMap(view.bool) != true,
              view.member("more", of: 0).flatMap(view.bool) != true, // streamed: StoreMethods
              peer.grant.store, !context.isShuttingDown,
              let user = Self.user(view, call, peer: peer),
              let store = context.registry.leaseIfReady(user) else { return .slow }
        let registry = context.registry
        // Metrics, when served: the method's handles and the start, read once.
        let handles = context.metrics.map { metrics -> DaemonMetrics.RequestHandles in
            switch method {
            case .open: return metrics.open
            case .query: return metrics.query
            case .execute: return metrics.execute
            case .batch: return metrics.batch
            }
        }
        let started = handles == nil ? 0 : StoreClock.now()
        let mark = writer.bytes.count
        defer {
            if let handles, writer.bytes.count > mark {
                handles.record(outcome: DaemonMetrics.outcome(of: writer.bytes[mark...]), nanoseconds: StoreClock.now() - started,
                               user: user.rawValue, bytes: writer.bytes.count - mark)
            }
        }
        let runner = SQLRunner(store: store, limits: limits)
        switch method {
        case .open:
            guard let info = store.versionInfoIfIdle() else { break }
            registry.release(user)
            writer.bytes.append(contentsOf: StoreMethods.openReply(user, info, report: nil))
            return .answered
        case .query, .execute:
            // A write that may wait for the replica goes to StoreMethods (Execute of a read also does: rare).
            if method == .execute && context.mayBeDurable(view, call) { break }
            guard let statement = try? SQLRunner.Statement.single(view, call) else { break }
            let output: SQLRunner.Output = method == .query ? .rows : .changes
            let inline = store.runIfIdle { connection in
                runner.reply(connection, view, statement, output: output, inlineBudget: SQLRunner.inlineBudgetNanoseconds, into: &writer)
            }
            if inline == true {
                registry.release(user)
                return .answered
            }
            let message = JSONMessage(copying: view)
            enqueue(store, user: user, method: view.string(methodToken), handles: handles, started: started, reply: makeQueuedReply()) { db in
                var writer = JSONWriter(capacity: 256)
                message.withView { view in
                    _ = runner.reply(db.sqliteConnection!, view, statement, output: output, inlineBudget: nil, into: &writer)
                }
                return writer.bytes
            }
            return .queued
        case .batch:
            if context.mayBeDurable(view, call) { break }
            let transaction: Bool
            switch view.member("transaction", of: call).map(view.kind) {
            case nil, .null?: transaction = true
            case .true?: transaction = true
            case .false?: transaction = false
            default: registry.release(user); return .slow
            }
            let statements: [SQLRunner.Statement]
            do throws(VarlinkError) {
                statements = try SQLRunner.Statement.batch(view, view.member("statements", of: call), maximum: limits.maxBatchStatements)
            } catch {
                registry.release(user)
                VarlinkReply.encode(error, into: &writer)
                return .answered
            }
            let message = JSONMessage(copying: view)
            enqueue(store, user: user, method: view.string(methodToken), handles: handles, started: started, reply: makeQueuedReply()) { db in
                BatchRunner(runner: runner).reply(db, message: message, statements: statements, mode: transaction ? .transaction : .statements)
            }
            return .queued
        }
        registry.release(user)
        return .slow
    }

    /// Runs `work` on `store`'s queue; its reply goes to `reply`, and the lease ends.
    private func enqueue(_ store: Store, user: UserID, method: String, handles: DaemonMetrics.RequestHandles?, started: UInt64,
                         reply: QueuedReply, _ work: @escaping @Sendable (Database) -> [UInt8]) {
        let registry = context.registry, context = self.context
        let start = handles == nil ? StoreClock.now() : started
        store.enqueue(work) { bytes in
            registry.release(user)
            reply.complete(bytes)
            let elapsed = StoreClock.now() - start
            handles?.record(outcome: DaemonMetrics.outcome(of: bytes[...]), nanoseconds: elapsed, user: user.rawValue, bytes: bytes.count)
            context.logIfSlow(method: method, user: user.rawValue, elapsed: .nanoseconds(Int64(elapsed)))
        }
    }

    private static func method(_ view: JSONView, _ token: Int) -> Method? {
        if view.stringEquals(token, "io.userstore.Store.Query") { return .query }
        if view.stringEquals(token, "io.userstore.Store.Execute") { return .execute }
        if view.stringEquals(token, "io.userstore.Store.Open") { return .open }
        if view.stringEquals(token, "io.userstore.Store.Batch") { return .batch }
        return nil
    }

    /// The call's store: its `user`, or with per-Unix-user stores the caller's own (nil: let
    /// the full handler name the problem).
    private static func user(_ view: JSONView, _ call: Int, peer: PeerIdentity) -> UserID? {
        let token = view.member("user", of: call)
        if let only = peer.grant.onlyStore {
            guard token == nil || view.kind(token!) == .null || view.string(token!) == only else { return nil }
            return try? UserID(only)
        }
        guard let token, view.kind(token) == .string else { return nil }
        return try? UserID(view.string(token))
    }
}
