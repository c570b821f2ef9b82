import GRDB
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import Varlink

/// Answers the calls that make up nearly all traffic on the connection's event loop, inside the
/// channel handler: no task, no executor hop, no allocation beyond the reply.
///
/// An `Open`, `Query`, `Execute` or `Batch` for a store that is open, up to date and served by
/// this host is decoded here and its statements run where ``StatementDispatch`` decides:
/// inline on an idle store, or on the store's serial queue, the reply coming back to the event
/// loop through a ``QueuedReply`` (a durable write's once the replica has it). Everything
/// else — a store to open or migrate, a failed store, a streamed `Query`, `Admin` and
/// `org.varlink.service` calls, any call whose error the full handlers name — returns
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

    /// Whether `method` is served here (a `switch`: no hashing on the hot path).
    private static func serves(_ method: Method) -> Bool {
        switch method {
        case .open, .query, .execute, .batch: true
        default: false
        }
    }

    /// Handles the call in `view` (a parsed message of `method`) from `peer`, appending its reply
    /// to `writer`, or queueing it with a ``QueuedReply`` from `makeQueuedReply`.
    func handle(_ view: JSONView, _ method: Method, peer: PeerIdentity, limits: RequestLimits, into writer: inout JSONWriter,
                makeQueuedReply: () -> QueuedReply) -> Outcome {
        guard Self.serves(method),
              let call = view.member("parameters", of: 0), view.kind(call) == .object,
              view.member("oneway", of: 0).flatMap(view.bool) != true,
              view.member("more", of: 0).flatMap(view.bool) != true, // streamed: StoreMethods
              peer.grant.store, !context.isShuttingDown,
              let user = Self.user(view, call, peer: peer),
              let store = context.registry.leaseIfReady(user) else { return .slow }
        // Metrics, when served: the method's handles and the start, read once.
        let handles = context.metrics?.requestHandles(method: method)
        let started = handles == nil ? 0 : StoreClock.now()
        let mark = writer.bytes.count
        let outcome: Outcome
        switch method {
        case .open:
            outcome = run(StatementDispatch(runner: SQLRunner(store: store, limits: limits), work: .open(nil)), view,
                          Queued(context: context, user: user, method: method, durable: false, handles: handles),
                          started: started, into: &writer, makeQueuedReply: makeQueuedReply)
        case .query, .execute, .batch:
            if let dispatch = Self.dispatch(method, view, call, runner: SQLRunner(store: store, limits: limits), into: &writer),
               let durable = try? method == .query ? false : context.isDurable(view, call, user: user.rawValue) {
                outcome = run(dispatch, view, Queued(context: context, user: user, method: method, durable: durable, handles: handles),
                              started: started, into: &writer, makeQueuedReply: makeQueuedReply)
            } else {
                outcome = writer.bytes.count > mark ? .answered : .slow
            }
        default:
            outcome = .slow
        }
        switch outcome {
        case .answered:
            context.registry.release(user)
            handles?.record(outcome: DaemonMetrics.outcome(of: writer.bytes[mark...]), nanoseconds: StoreClock.now() - started,
                            user: user.rawValue, bytes: writer.bytes.count - mark)
        case .slow:
            context.registry.release(user)
        case .queued:
            break
        }
        return outcome
    }

    /// What the call's statements are; nil when the full handler must name a problem, or when
    /// the problem's reply is already in `writer`.
    private static func dispatch(_ method: Method, _ view: JSONView, _ call: Int, runner: SQLRunner,
                                 into writer: inout JSONWriter) -> StatementDispatch? {
        if method == .batch {
            let transaction: Bool
            switch view.member("transaction", of: call).map(view.kind) {
            case nil, .null?, .true?: transaction = true
            case .false?: transaction = false
            default: return nil
            }
            do throws(VarlinkError) {
                let statements = try SQLRunner.Statement.batch(view, view.member("statements", of: call), maximum: runner.limits.maxBatchStatements)
                return StatementDispatch(runner: runner, work: .batch(statements, transaction ? .transaction : .statements))
            } catch {
                VarlinkReply.encode(error, into: &writer)
                return nil
            }
        }
        guard let statement = try? SQLRunner.Statement.single(view, call) else { return nil }
        return StatementDispatch(runner: runner, work: .statement(statement, method == .query ? .rows : .changes))
    }

    /// Runs `dispatch` for the call in `view`: answered inline, or queued (its reply goes to a
    /// ``QueuedReply``, and the lease ends with it), as ``StatementDispatch`` decides.
    /// `started`: when the call arrived, if it is measured (0: the slow-request log times it from
    /// the queueing on, as an inline answer is never slow).
    private func run(_ dispatch: StatementDispatch, _ view: JSONView, _ queued: Queued, started: UInt64, into writer: inout JSONWriter,
                     makeQueuedReply: () -> QueuedReply) -> Outcome {
        var dispatch = dispatch
        dispatch.durable = queued.durable
        let inline = dispatch.run(view, into: &writer) {
            let reply = makeQueuedReply(), started = started == 0 ? StoreClock.now() : started
            return { queued.complete(reply, $0.bytes, started: started) }
        }
        return inline ? .answered : .queued
    }

    /// A call waiting on its store's queue: what its completion needs.
    private struct Queued: Sendable {
        let context: DaemonContext
        let user: UserID
        let method: Method
        let durable: Bool
        let handles: DaemonMetrics.RequestHandles?

        /// Hands the reply over once it is ready (a durable write's once the replica has it),
        /// then ends the lease and records the call, `started` then.
        func complete(_ reply: QueuedReply, _ bytes: [UInt8], started: UInt64) {
            guard durable else { return finish(reply, bytes, started: started) }
            Task { finish(reply, await context.replyWhenReplicated(user, bytes), started: started) }
        }

        private func finish(_ reply: QueuedReply, _ bytes: [UInt8], started: UInt64) {
            // Released once the reply is ready: a durable write keeps the store open (and
            // registered) until the replica has it.
            context.registry.release(user)
            reply.complete(bytes)
            let elapsed = StoreClock.now() - started
            handles?.record(outcome: DaemonMetrics.outcome(of: bytes[...]), nanoseconds: elapsed, user: user.rawValue, bytes: bytes.count)
            context.logIfSlow(method: method.rawValue, user: user.rawValue, elapsed: .nanoseconds(Int64(elapsed)))
        }
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
