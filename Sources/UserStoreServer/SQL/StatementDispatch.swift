import GRDB
import UserStoreCore
import Varlink

/// Where a Store call's work runs, decided in this one place for every kind of call — on the
/// event loop's fast path, in a task, inside an interactive transaction:
///
/// - an `Open` (its reply is the store's app-version row) and a single statement outside an
///   interactive transaction run **inline**, on the caller's thread, when the store is idle: a
///   statement read-only, for up to ``SQLRunner/inlineBudgetNanoseconds`` (a point query costs
///   microseconds; a hop to the store's queue and back costs two thread wake-ups);
/// - everything else — a write, a statement that gave up its inline run, a `Batch`, a store
///   with work queued, a statement of an interactive transaction, a durable write (its reply
///   waits for the replica anyway) — is **queued** on the store's serial queue, in arrival order;
/// - a streamed `Query` (``StreamedQuery``) is never inline either: it holds a read transaction
///   of its own across its replies, and each step is queued as that transaction's.
///
/// The store must stay leased until the reply is ready.
struct StatementDispatch {
    enum Work {
        /// One statement (`Query`: rows, `Execute`: changes).
        case statement(SQLRunner.Statement, SQLRunner.Output)
        /// A `Batch`.
        case batch([SQLRunner.Statement], BatchRunner.Mode)
        /// An `Open`: the store's app-version row, and what opening the store did (nil: it was
        /// open already).
        case open(MigrationReport?)
    }

    /// What queued work hands back.
    struct Outcome: Sendable {
        /// The whole reply (`{"parameters": …}` or an error, and its NUL).
        let bytes: [UInt8]
        /// Whether the interactive transaction it ran in still holds the store (false once
        /// SQLite rolled it back itself); true outside a transaction.
        let transactionAlive: Bool
    }

    let runner: SQLRunner
    let work: Work
    /// The interactive transaction the work belongs to: it is queued as that transaction's.
    var transaction: Store.TransactionKey? = nil
    /// A durable write: never inline (its reply waits for the replica anyway).
    var durable = false

    private var store: Store { runner.store }

    /// Runs the work of the call in `view`: inline, appending its reply to `writer` (true), or
    /// queued (false), handing its reply to the completion that `queued` makes (called only
    /// then, before the work is queued) on the store's queue thread.
    func run(_ view: JSONView, into writer: inout JSONWriter, queued: () -> @Sendable (Outcome) -> Void) -> Bool {
        if runInline(view, into: &writer) { return true }
        enqueue(JSONMessage(copying: view), queued())
        return false
    }

    /// The reply to the call in `message`, run inline or queued as above (from a task).
    func reply(_ message: JSONMessage) async -> Outcome {
        var writer = JSONWriter(capacity: 256)
        if message.withView({ view in runInline(view, into: &writer) }) { return Outcome(bytes: writer.bytes, transactionAlive: true) }
        return await withCheckedContinuation { continuation in
            enqueue(message) { continuation.resume(returning: $0) }
        }
    }

    /// The reply to `work` of the call in `message` on `user`'s store, for calls that do not
    /// come through the event loop's fast path (``FastPath``): the store is leased with `access`
    /// (opened and migrated first if need be) until the reply is ready — for a durable write,
    /// until the replica has it (an eviction in between would unregister it under the sync).
    static func leasedReply(_ work: Work, of message: JSONMessage, for user: UserID, access: StoreRegistry.Access = .client,
                      durable: Bool = false, context: DaemonContext) async throws -> [UInt8] {
        let limits = context.limits
        return try await context.registry.withStore(user, access: access) { store in
            var dispatch = StatementDispatch(runner: SQLRunner(store: store, limits: limits), work: work)
            dispatch.durable = durable
            let reply = await dispatch.reply(message).bytes
            return durable ? await context.replyWhenReplicated(user, reply) : reply
        }
    }

    /// Runs the work right here if it may run inline and the store is idle; true if it did
    /// (its reply is in `writer`).
    private func runInline(_ view: JSONView, into writer: inout JSONWriter) -> Bool {
        guard !durable, transaction == nil else { return false }
        switch work {
        case .statement(let statement, let output):
            return store.runIfIdle { connection in
                runner.reply(connection, view, statement, output: output, inlineBudget: SQLRunner.inlineBudgetNanoseconds, into: &writer)
            } == true
        case .open(let report):
            // A row that cannot be read is named in the store's turn.
            guard let info = store.versionInfoIfIdle() else { return false }
            writer.bytes.append(contentsOf: StoreMethods.openReply(store.user, info, report: report))
            return true
        case .batch:
            return false
        }
    }

    /// Queues the work of the call in `message` on the store's serial queue, whatever it is
    /// (a transaction's statements, which never run inline, come here directly).
    func enqueue(_ message: JSONMessage, _ completion: @escaping @Sendable (Outcome) -> Void) {
        let runner = self.runner, work = self.work, transaction = self.transaction, store = self.store
        store.enqueue(transaction: transaction, { db in
            let bytes: [UInt8]
            switch work {
            case .statement(let statement, let output):
                var writer = JSONWriter(capacity: 256)
                message.withView { view in
                    _ = runner.reply(db.sqliteConnection!, view, statement, output: output, inlineBudget: nil,
                                     inTransaction: transaction != nil, into: &writer)
                }
                bytes = writer.bytes
            case .batch(let statements, let mode):
                bytes = BatchRunner(runner: runner).reply(db, message: message, statements: statements, mode: mode)
            case .open(let report):
                do {
                    bytes = StoreMethods.openReply(store.user, try store.versionInfo(db), report: report)
                } catch {
                    bytes = VarlinkReply.encode(Errors.from(error))
                }
            }
            return Outcome(bytes: bytes, transactionAlive: transaction.map { store.transactionIsAlive($0, db) } ?? true)
        }, completion: completion)
    }
}
