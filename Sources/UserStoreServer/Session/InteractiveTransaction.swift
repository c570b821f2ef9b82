import GRDB
import Logging
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import Varlink

/// A connection's interactive transaction — at most one open at a time: `Begin`, statements
/// with `transaction`, `Commit`, `Rollback`.
///
/// A transaction holds its user's store (``Store/beginTransaction(_:immediate:completion:)``):
/// other connections' calls for that user wait their turn in order; other users never wait. It
/// belongs to the connection that began it; closing the connection rolls it back; it is rolled
/// back when idle longer than `limits.transactionIdleMilliseconds` or open longer than
/// `limits.transactionMilliseconds`. Its calls run on the store's queue, never inline.
///
/// Confined to its connection's event loop (asserted in debug builds); other threads reach it
/// through `loop.execute`.
package final class InteractiveTransaction: @unchecked Sendable {
    /// The parts of an interactive transaction a call can be.
    package enum Call {
        case begin
        case end(commit: Bool)
        /// A Query (`.rows`), Execute (`.changes`) or Batch (nil) naming a transaction.
        case statement(SQLRunner.Output?)

        /// Whether the call in `view`, of `method`, is about an interactive transaction, and
        /// which part.
        package init?(_ method: Method, _ view: JSONView) {
            switch method {
            case .begin: self = .begin
            case .commit: self = .end(commit: true)
            case .rollback: self = .end(commit: false)
            case .query, .execute, .batch:
                guard let call = view.member("parameters", of: 0), let named = view.member("transaction", of: call), view.kind(named) == .string else { return nil }
                self = .statement(method == .query ? .rows : method == .execute ? .changes : nil)
            default: return nil
            }
        }
    }

    let context: DaemonContext
    let logger: Logger
    let peer: PeerIdentity
    let limits: RequestLimits
    let replies: ReplyQueue
    private var loop: EventLoop { replies.loop }
    /// The connection's interactive transaction (at most one).
    private(set) var transaction: OpenTransaction?
    /// The connection closed: whatever arrives later is rolled back.
    private var closed = false

    init(context: DaemonContext, logger: Logger, peer: PeerIdentity, limits: RequestLimits, replies: ReplyQueue) {
        self.context = context
        self.logger = logger
        self.peer = peer
        self.limits = limits
        self.replies = replies
    }

    /// The error for a call that would wait for this connection's own transaction: it names
    /// (or, with per-Unix-user stores, implies) the user whose store the transaction holds
    /// without naming the transaction. Without this check it would sit behind the transaction
    /// until the idle time-out rolled it back (found by the live fuzz).
    func waitsForOwnTransaction(_ view: JSONView) -> VarlinkError? {
        assert(loop.inEventLoop)
        guard let transaction, transaction.isLive, view.kind(0) == .object,
              let call = view.member("parameters", of: 0), view.kind(call) == .object else { return nil }
        let user: String?
        if let token = view.member("user", of: call), view.kind(token) == .string {
            user = view.string(token)
        } else {
            user = peer.grant.onlyStore
        }
        guard user == transaction.user.rawValue else { return nil }
        return Errors.transactionInProgress(user: transaction.user.rawValue, transaction: transaction.id)
    }

    /// Handles a transaction call of `method` (its reply takes its turn among the connection's
    /// replies).
    func handle(_ kind: Call, _ method: Method, _ view: JSONView) {
        assert(loop.inEventLoop)
        let reply = replies.reserve()
        if let metrics = context.metrics { reply.measure(metrics.requestHandles(method: method)) }
        let call = view.member("parameters", of: 0).flatMap { view.kind($0) == .object ? $0 : nil }
        do throws(VarlinkError) {
            guard view.member("oneway", of: 0).flatMap(view.bool) != true else { throw .invalidParameter("oneway") }
            guard peer.grant.store else {
                throw Errors.permissionDenied("uid \(peer.uid) is not an allowed client (access.clientUsers / access.clientGroups)")
            }
            switch kind {
            case .begin: try begin(view, call, reply)
            case .end(let commit): try end(view, call, commit: commit, reply)
            case .statement(let output): try statement(view, call!, output: output, reply)
            }
        } catch {
            reply.completeOnLoop(VarlinkReply.encode(error))
        }
    }

    // MARK: Begin

    private func begin(_ view: JSONView, _ call: Int?, _ reply: QueuedReply) throws(VarlinkError) {
        if context.isShuttingDown { throw Errors.shuttingDown }
        let user = try transactionUser(view, call)
        let immediate: Bool
        switch call.flatMap({ view.member("mode", of: $0) }) {
        case nil: immediate = true
        case let token? where view.kind(token) == .null: immediate = true
        case let token? where view.stringEquals(token, "immediate"): immediate = true
        case let token? where view.stringEquals(token, "deferred"): immediate = false
        default: throw .invalidParameter("mode")
        }
        if let current = transaction, current.isLive { throw Errors.limitExceeded("transactions", maximum: 1) }
        let transaction = OpenTransaction(user: user, immediate: immediate, loop: loop)
        self.transaction = transaction
        let registry = context.registry
        if let store = registry.leaseIfReady(user) {
            start(transaction, on: store, reply)
            return
        }
        // The store must be opened or migrated first: in a task, then back here.
        let loop = self.loop
        Task {
            do {
                let store = try await registry.lease(user)
                loop.execute { [self] in start(transaction, on: store, reply) }
            } catch {
                loop.execute { [self] in
                    if self.transaction === transaction { self.transaction = nil }
                    reply.completeOnLoop(VarlinkReply.encode(Errors.from(error)))
                }
            }
        }
    }

    /// Begins `transaction` on `store` (leased for it), in the store's turn.
    private func start(_ transaction: OpenTransaction, on store: Store, _ reply: QueuedReply) {
        let registry = context.registry
        guard !closed, self.transaction === transaction else {
            registry.release(transaction.user)
            return
        }
        transaction.store = store
        let loop = self.loop
        store.beginTransaction(transaction.key, immediate: transaction.immediate) { error in
            loop.execute { [self] in
                if let error {
                    registry.release(transaction.user)
                    if self.transaction === transaction { self.transaction = nil }
                    reply.completeOnLoop(VarlinkReply.encode(Errors.sqlError(code: error.extendedResultCode.rawValue, message: error.message ?? "\(error.resultCode)")))
                    return
                }
                guard !closed, self.transaction === transaction else {
                    // The connection went away meanwhile.
                    store.endTransaction(transaction.key, commit: false) { _ in registry.release(transaction.user) }
                    return
                }
                transaction.state = .open
                context.metrics?.transactionsOpen.add(1, ordering: .relaxed)
                transaction.totalTimer = loop.schedule(after: UInt64(limits.transactionMilliseconds) * 1_000_000) { [self] in
                    expire(transaction, reason: "total")
                }
                armIdleTimer(transaction)
                reply.completeOnLoop(VarlinkReply.encode(["transaction": .string(transaction.id)]))
            }
        }
    }

    /// The store a Begin addresses; with per-Unix-user stores, only the caller's own.
    private func transactionUser(_ view: JSONView, _ call: Int?) throws(VarlinkError) -> UserID {
        let token = call.flatMap { view.member("user", of: $0) }
        if let only = peer.grant.onlyStore {
            if let token, view.kind(token) != .null, view.string(token) != only {
                throw Errors.permissionDenied("stores are per Unix user: uid \(peer.uid) may only reach store '\(only)'")
            }
            return try CallParameters.userID(only)
        }
        guard let token, view.kind(token) == .string else { throw .invalidParameter("user") }
        return try CallParameters.userID(view.string(token))
    }

    // MARK: Calls in a transaction

    /// The open transaction `call` names; a name that is not this connection's open transaction
    /// is `NoSuchTransaction`, one that was rolled back meanwhile `TransactionExpired` (once).
    private func namedTransaction(_ view: JSONView, _ call: Int?) throws(VarlinkError) -> OpenTransaction {
        guard let call, let token = view.member("transaction", of: call), view.kind(token) == .string else { throw .invalidParameter("transaction") }
        let id = view.string(token)
        guard let transaction, transaction.id == id else { throw Errors.noSuchTransaction(id) }
        switch transaction.state {
        case .open: return transaction
        case .beginning: throw Errors.noSuchTransaction(id)
        case .ended(let reason):
            self.transaction = nil
            throw Errors.transactionExpired(id, reason: reason)
        }
    }

    private func statement(_ view: JSONView, _ call: Int, output: SQLRunner.Output?, _ reply: QueuedReply) throws(VarlinkError) {
        let transaction = try namedTransaction(view, call)
        if let token = view.member("user", of: call), view.kind(token) != .null, view.string(token) != transaction.user.rawValue {
            throw .invalidParameter("user")
        }
        let work: StatementDispatch.Work
        if let output {
            work = .statement(try SQLRunner.Statement.single(view, call), output)
        } else {
            work = .batch(try SQLRunner.Statement.batch(view, view.member("statements", of: call), maximum: limits.maxBatchStatements), .savepoint)
        }
        let dispatch = StatementDispatch(runner: SQLRunner(store: transaction.store!, limits: limits), work: work, transaction: transaction.key)
        transaction.inFlight += 1
        cancelIdleTimer(transaction)
        let loop = self.loop
        dispatch.enqueue(JSONMessage(copying: view)) { outcome in
            loop.execute { [self] in
                transaction.inFlight -= 1
                if !outcome.transactionAlive, transaction.state == .open {
                    // SQLite rolled the transaction back itself (an interrupted write, a full
                    // disk): the store is free again; the next call learns why.
                    end(transaction, reason: "rolled back by SQLite after a failed statement", rolledBack: true)
                } else if transaction.state == .open, transaction.inFlight == 0 {
                    armIdleTimer(transaction)
                }
                reply.completeOnLoop(outcome.bytes)
            }
        }
    }

    // MARK: Commit and Rollback

    private func end(_ view: JSONView, _ call: Int?, commit: Bool, _ reply: QueuedReply) throws(VarlinkError) {
        let transaction = try namedTransaction(view, call)
        let durable = commit ? try context.isDurable(view, call, user: transaction.user.rawValue) : false
        transaction.state = .ended(reason: commit ? "committed" : "rolled back")
        cancelTimers(transaction)
        context.metrics?.transactionEnded(commit ? "committed" : "rolled_back")
        let store = transaction.store!, context = self.context, registry = context.registry, loop = self.loop
        store.endTransaction(transaction.key, commit: commit) { error in
            // Released once the reply is ready: a durable commit keeps the store open (and
            // registered) until the replica has it.
            let send: @Sendable ([UInt8]) -> Void = { bytes in
                registry.release(transaction.user)
                loop.execute { [self] in
                    if self.transaction === transaction { self.transaction = nil }
                    reply.completeOnLoop(bytes)
                }
            }
            if let error {
                send(VarlinkReply.encode(Errors.sqlError(code: error.extendedResultCode.rawValue, message: error.message ?? "\(error.resultCode)")))
            } else if durable {
                Task { send(await context.replyWhenReplicated(transaction.user, VarlinkReply.encode([:]))) }
            } else {
                send(VarlinkReply.encode([:]))
            }
        }
    }

    // MARK: Time-outs and endings

    private func armIdleTimer(_ transaction: OpenTransaction) {
        cancelIdleTimer(transaction)
        transaction.idleTimer = loop.schedule(after: UInt64(limits.transactionIdleMilliseconds) * 1_000_000) { [self] in
            expire(transaction, reason: "idle")
        }
    }

    private func cancelIdleTimer(_ transaction: OpenTransaction) {
        if let timer = transaction.idleTimer { loop.cancel(timer) }
        transaction.idleTimer = nil
    }

    private func cancelTimers(_ transaction: OpenTransaction) {
        cancelIdleTimer(transaction)
        if let timer = transaction.totalTimer { loop.cancel(timer) }
        transaction.totalTimer = nil
    }

    /// A time-out: rolls `transaction` back unless it already ended (or, for `idle`, a call of
    /// it is running).
    private func expire(_ transaction: OpenTransaction, reason: String) {
        guard self.transaction === transaction, transaction.state == .open else { return }
        if reason == "idle" && transaction.inFlight > 0 { return }
        end(transaction, reason: reason, rolledBack: false)
    }

    /// Ends `transaction` without the client asking: rolled back (unless SQLite already did),
    /// the store released, the journal told; the next call naming it gets `TransactionExpired`.
    private func end(_ transaction: OpenTransaction, reason: String, rolledBack: Bool) {
        transaction.state = .ended(reason: reason)
        cancelTimers(transaction)
        context.metrics?.transactionEnded(rolledBack ? "aborted" : "expired")
        let registry = context.registry
        let seconds = Double(StoreClock.now() - transaction.began) / 1e9
        logger.warning("transaction \(transaction.id) expired (\(reason)): rolled back after \(String(format: "%.1f", seconds)) s", metadata: [
            "event": "transaction-expired", "user": .string(transaction.user.rawValue), "transaction": .string(transaction.id),
            "reason": .string(reason), "peer_pid": "\(peer.pid)", "peer_uid": "\(peer.uid)",
            "duration_usec": "\(Int64(seconds * 1e6))",
        ])
        if rolledBack {
            registry.release(transaction.user)
        } else {
            transaction.store!.endTransaction(transaction.key, commit: false) { _ in registry.release(transaction.user) }
        }
    }

    /// The connection closed with a transaction open: rolled back, store released.
    func abandon() {
        assert(loop.inEventLoop)
        closed = true
        guard let transaction, transaction.state == .open, let store = transaction.store else { return }
        transaction.state = .ended(reason: "connection closed")
        cancelTimers(transaction)
        context.metrics?.transactionEnded("expired")
        let registry = context.registry
        store.endTransaction(transaction.key, commit: false) { _ in registry.release(transaction.user) }
    }

    /// Whether a transaction of this connection holds a store (shutdown waits for it).
    var holdsStore: Bool { transaction?.isLive ?? false }
}
