import Logging
import UserStoreClusterServing
import UserStoreConfiguration
import UserStoreInterface
import UserStoreProtocol
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// One client connection's calls, as the transport hands them over: decoded once, then sent
/// where they go — to another host (``ForwardedCalls``), to the connection's interactive
/// transaction (``InteractiveTransaction``), answered on the event loop or queued on a store
/// (``FastPath``), or, for anything else, to the ``RequestRouter`` in a task that the
/// connection runs alone (the session makes it; the transport only starts it). Replies go to
/// the connection's ``ReplyQueue``.
///
/// Data flows one way: the transport calls the session, the session writes replies; nothing
/// here knows the socket. Confined to the connection's event loop, like the connection.
final class Session {
    /// What every session shares.
    struct Shared: Sendable {
        let context: DaemonContext
        let fastPath: FastPath
        let router: RequestRouter
        let logger: Logger
        /// Sends calls for users another host owns to that host (`cluster.forward`).
        let forwarder: Forwarder?
    }

    /// What the transport must do next with a call the session took.
    enum Route {
        /// Nothing: its reply is written or reserved.
        case done
        /// Nothing yet: the call waits until every earlier reply is out (it stays in the input
        /// and comes back, with its descriptors).
        case later
        /// Start this work alone (a call for the ``RequestRouter``, a stream relayed from another
        /// host): nothing else starts until it ends.
        case task(TaskStart)
    }

    /// Starts work that runs alone on the connection: it sends its replies through `send`
    /// (which waits while the client does not read) and calls `end` when it is over.
    typealias TaskStart = @Sendable (_ send: @escaping ReplySink, _ end: @escaping @Sendable () -> Void) -> Void

    let shared: Shared
    let peer: PeerIdentity
    let limits: RequestLimits
    let replies: ReplyQueue
    let interactive: InteractiveTransaction
    /// Calls for users other hosts own (created by the first one).
    private(set) var forwarded: ForwardedCalls?
    private var tape: JSONTape

    init(shared: Shared, peer: PeerIdentity, limits: RequestLimits, replies: ReplyQueue) {
        self.shared = shared
        self.peer = peer
        self.limits = limits
        self.replies = replies
        self.tape = JSONTape(maxDepth: limits.maxJSONDepth)
        self.interactive = InteractiveTransaction(context: shared.context, logger: shared.logger, peer: peer, limits: limits, replies: replies)
    }

    /// Takes the call in `bytes` (without its NUL) and the descriptors that came with it (it
    /// owns them from now on, unless it answers ``Route/later``). `stopping`: the connection is
    /// ending (shutdown, an oversized message), and calls not started are refused.
    func handle(_ bytes: UnsafeBufferPointer<UInt8>, descriptors: [Int32], stopping: Bool) -> Route {
        assert(replies.loop.inEventLoop)
        do {
            try tape.parse(bytes)
        } catch {
            descriptors.forEach { Glibc.close($0) }
            replies.append(VarlinkError.invalidRequest("\(error)"))
            shared.context.metrics?.requestHandles(method: nil).record(outcome: "InvalidRequest", nanoseconds: 0)
            return .done
        }
        return tape.withView(bytes) { view in route(view, bytes, descriptors: descriptors, stopping: stopping) }
    }

    private func route(_ view: JSONView, _ bytes: UnsafeBufferPointer<UInt8>, descriptors: [Int32], stopping: Bool) -> Route {
        // The method, read once: every step below dispatches on it.
        let method = Method.of(view)
        // A parameter the method does not define, or an integer beyond 64 bits: refused on every
        // path, once the peer may call the method at all (PermissionDenied comes first).
        if let method, peer.mayCall(method), let parameter = ParameterCheck.invalidParameter(view, method) {
            shared.context.metrics?.requestHandles(method: method).record(outcome: "InvalidParameter", nanoseconds: 0)
            return refuse(.invalidParameter(parameter), descriptors)
        }
        // Another host owns the user (or holds the transaction the call names): sent there.
        if let method, let forwarder = shared.forwarder, peer.forwardedFrom == nil,
           let target = forwarder.target(of: view, method, grant: peer.grant, transactions: forwarded?.transactions ?? [:]) {
            if stopping { // a transaction open on another host ends with the link: rolled back there
                return refuse(Errors.shuttingDown, descriptors)
            }
            let forwarded = self.forwarded ?? ForwardedCalls(forwarder: forwarder, loop: replies.loop, limits: limits, replies: replies)
            self.forwarded = forwarded
            let route = forwarded.forward(view, method, bytes, to: target)
            // No io.userstore.Store call takes descriptors; a call that waits keeps its own.
            if case .later = route {} else { descriptors.forEach { Glibc.close($0) } }
            return route
        }
        if let method, let call = InteractiveTransaction.Call(method, view) {
            descriptors.forEach { Glibc.close($0) }
            interactive.handle(call, method, view)
            return .done
        }
        if stopping { return refuse(Errors.shuttingDown, descriptors) }
        if let error = interactive.waitsForOwnTransaction(view) {
            // Shutdown may have begun before this connection's loop got to quiesce it
            // (`stopping`): the call would be refused for that anyway, as the router does.
            return refuse(shared.context.isShuttingDown ? Errors.shuttingDown : error, descriptors)
        }
        if let method, descriptors.isEmpty { // only task calls take descriptors
            var outcome = FastPath.Outcome.slow
            replies.append { writer in
                outcome = shared.fastPath.handle(view, method, peer: peer, limits: limits, into: &writer, makeQueuedReply: replies.reserve)
            }
            if outcome != .slow { return .done }
        }
        guard replies.isInOrder else { return .later }
        do throws(VarlinkError) {
            // The bytes outlive the input buffer; the tokens parsed above go with them.
            return .task(routed(try Request(JSONMessage(bytes: Array(bytes), parsed: tape), method: method, descriptors: PassedDescriptors(descriptors))))
        } catch {
            return refuse(error, descriptors)
        }
    }

    /// `request` handled by the ``RequestRouter`` in a task of its own; the descriptors it did
    /// not keep are closed when it ends.
    private func routed(_ request: Request) -> TaskStart {
        let router = shared.router, peer = self.peer
        return { send, end in
            Task {
                try? await router.handle(request, peer: peer, send: send)
                request.descriptors.closeAll()
                end()
            }
        }
    }

    /// Answers with `error`, closing the call's descriptors.
    private func refuse(_ error: VarlinkError, _ descriptors: [Int32]) -> Route {
        descriptors.forEach { Glibc.close($0) }
        replies.append(error)
        return .done
    }

    /// Nothing of the session waits: no transaction holds a store, no call waits for another host.
    var isIdle: Bool { !interactive.holdsStore && forwarded?.isIdle != false }

    /// Ends calls to other hosts that waited too long.
    func sweep(now: UInt64) {
        assert(replies.loop.inEventLoop)
        forwarded?.sweep(now: now)
    }

    /// The connection closed: its transaction rolled back, its links to other hosts closed.
    func end() {
        assert(replies.loop.inEventLoop)
        interactive.abandon()
        forwarded?.closeAll()
        forwarded = nil
    }
}
