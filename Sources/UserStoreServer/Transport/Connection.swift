import CUnixSocket
import Logging
import UserStoreConfiguration
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// One client connection's socket, served on its ``EventLoop``: the transport at both ends of
/// the pipeline. Bytes come in through an ``InputBuffer``, each whole call goes to the
/// connection's ``Session``, replies go out through its ``ReplyQueue``.
///
/// - **Framing**: a message longer than `limits.maxRequestBytes` gets `LimitExceeded` and the
///   connection is closed (nothing beyond the limit is ever buffered). File descriptors passed
///   with a call (`SCM_RIGHTS`) go with the message they arrived with.
/// - **Pipelining**: every complete call in the input is handled at once, and the replies
///   ready by the end of the loop's turn go out together then, in one write per connection
///   (``turnEnded()``). A client may send many calls without waiting.
/// - **Order**: replies leave in request order (the ``ReplyQueue``). A call the session sends
///   to a task runs alone: it starts when every earlier reply is out, and later calls wait for
///   it. Per store, statements keep arrival order (the store's queue; inline only when idle).
/// - **Backpressure**: the socket is not read while a task call runs, while too many replies
///   are pending, or while the client does not read its replies.
/// - **End** (``State``): a client that closes its sending side gets the replies to what it
///   sent first; at graceful shutdown (``quiesce()``) calls not yet started are refused and the
///   connection closes once the started ones have replied.
///
/// Thread-safety: confined to its loop's thread (asserted in debug builds); other threads
/// reach it only through `loop.execute`, hence `@unchecked Sendable`.
final class Connection: EventHandler, TurnEndHandler, @unchecked Sendable {
    /// Where the connection is in its life; it only moves forward.
    enum State: Equatable {
        /// Reading and answering calls.
        case serving
        /// The client closed its sending side: what it sent is answered, then the socket closes.
        case inputClosed
        /// Ending (shutdown, an oversized or stalled message): calls not started are refused
        /// (but those of a transaction that holds a store); closes once started calls replied.
        case stopping(inputClosed: Bool)
        case closed

        var acceptsInput: Bool { self == .serving }
        var isStopping: Bool { if case .stopping = self { true } else { false } }
        var clientClosed: Bool { self == .inputClosed || self == .stopping(inputClosed: true) }
    }

    /// Descriptors accepted with one read (more are closed by the kernel shim).
    static let maxPassedDescriptors = 16

    let descriptor: Int32
    let loop: EventLoop
    let peer: PeerIdentity
    let limits: RequestLimits
    let replies: ReplyQueue
    let session: Session
    private let tracker: ConnectionTracker
    private var token: UInt64 = 0
    private var interest: UInt32 = 0
    private(set) var state = State.serving

    private var input: InputBuffer
    /// Descriptors received and not yet handed over with their message.
    private var passed = ReceivedDescriptors()
    /// A call runs in a task (or a stream is relayed); nothing else starts until it ends.
    private var taskRunning = false
    private var processing = false
    /// ``resume()`` asked the loop for ``turnEnded()``, which has not come yet.
    private var turnEndAsked = false
    /// Task replies waiting for the client to read (backpressure on a streamed reply).
    private var sendWaiters: [CheckedContinuation<Void, any Error>] = []
    /// Since when a task's reply has waited for the client to read (nil: it is not waiting).
    private var sendBlockedSince: UInt64?
    /// When a byte last arrived (for `limits.idleConnectionSeconds`).
    private var lastActivity = StoreClock.now()
    /// Since when the input holds part of a message (for `limits.requestReadSeconds`).
    private var partialSince: UInt64?

    private init(descriptor: Int32, loop: EventLoop, shared: Session.Shared, peer: PeerIdentity, settings: RuntimeSettings) {
        self.descriptor = descriptor
        self.loop = loop
        self.peer = peer
        self.limits = settings.limits
        self.tracker = shared.context.connections
        self.input = InputBuffer(maxMessageBytes: settings.limits.maxRequestBytes)
        self.replies = ReplyQueue(loop: loop)
        self.session = Session(shared: shared, peer: peer, limits: settings.limits, replies: replies)
        replies.onDelivery = { [unowned self] in resume() }
    }

    /// Serves a connection just accepted on `loop` (on its thread): reads the peer's
    /// credentials, applies the access rules and the connection limit.
    /// A connection from another daemon (`forwarded`, joined by the ``PeerListener``) is
    /// served as that `peer` instead; it counts against `limits.maxConnections` but no Unix
    /// user's, and is never closed for idleness (its daemon closes it with its client's).
    static func start(_ descriptor: Int32, loop: EventLoop, shared: Session.Shared, peer forwarded: PeerIdentity? = nil) {
        let settings = shared.context.settings.withLock { $0 }
        let peer: PeerIdentity
        if let forwarded {
            peer = forwarded
        } else {
            var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
            guard us_peer_credentials(descriptor, &pid, &uid, &gid) == 0 else {
                close(descriptor)
                return
            }
            let grant = settings.access.grant(uid: uid, gid: gid) { PeerCredentials.groups(of: uid, primary: gid) }
            peer = PeerIdentity(uid: uid, gid: gid, pid: pid, grant: grant)
        }
        let connection = Connection(descriptor: descriptor, loop: loop, shared: shared, peer: peer, settings: settings)
        let admission = shared.context.connections.admit(connection, maximum: settings.limits.maxConnections,
                                                         perUser: forwarded == nil ? settings.limits.maxConnectionsPerUser : .max)
        switch admission {
        case .admitted:
            do {
                connection.interest = EPOLLIN.rawValue
                connection.token = try loop.register(descriptor, events: connection.interest, connection)
            } catch {
                shared.context.connections.remove(connection)
                close(descriptor)
            }
        case .full, .userFull:
            // Told why, then closed; a best-effort write to a socket nobody reads yet.
            let error = Errors.limitExceeded(admission == .full ? "connections" : "connectionsPerUser",
                                             maximum: admission == .full ? settings.limits.maxConnections : settings.limits.maxConnectionsPerUser)
            let reply = VarlinkReply.encode(error)
            _ = reply.withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            close(descriptor)
        case .stopping:
            close(descriptor)
        }
    }

    var closed: Bool { state == .closed }

    // MARK: Events

    func ready(_ events: UInt32) {
        assert(loop.inEventLoop)
        if events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 && events & EPOLLIN.rawValue == 0 {
            closeNow()
            return
        }
        if events & EPOLLOUT.rawValue != 0 {
            writeUnsent()
            guard !closed else { return }
        }
        if events & EPOLLIN.rawValue != 0 { readAvailable() }
        guard !closed else { return }
        resume()
    }

    /// Reads what the socket has (a few reads at most) and handles the complete calls.
    private func readAvailable() {
        for _ in 0..<16 {
            // Closed by what the last turn handled: its descriptor is gone (and its number may
            // already belong to another connection), so never read it again.
            guard !shouldPauseReading, !state.clientClosed, !closed else { return }
            var count: Int32 = 0, room = 0
            // Descriptors land on the stack: no allocation per read.
            let received = withUnsafeTemporaryAllocation(of: Int32.self, capacity: Self.maxPassedDescriptors) { fds in
                let received = input.withFreeSpace { space in
                    room = space.count
                    return us_recv_with_fds(descriptor, space.baseAddress!, space.count, fds.baseAddress, Int32(Self.maxPassedDescriptors), &count)
                }
                if received > 0, count > 0 { passed.received(fds.prefix(Int(count)), endingAt: input.receivedOffset - 1) }
                return received
            }
            if received < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { return }
                closeNow()
                return
            }
            if received == 0 {
                state = state.isStopping ? .stopping(inputClosed: true) : .inputClosed
                processInput()
                return
            }
            lastActivity = StoreClock.now()
            processInput()
            // Part of a message waits for the rest: its time is counted from now on.
            if !input.isEmpty { partialSince = partialSince ?? lastActivity } else { partialSince = nil }
            if received < room { return } // the socket is likely drained
        }
    }

    // MARK: Handling calls

    /// Hands every complete call in the input to the session, while nothing blocks progress.
    private func processInput() {
        guard !processing, !closed else { return }
        processing = true
        defer { processing = false }
        // At shutdown, a connection whose transaction holds a store goes on: its calls may still
        // commit it (the others are refused).
        // `closed` is checked on every turn: a write failing inside the loop (the flush below, or
        // a reply the handler sent) closes the connection and empties the input under our feet
        // (the live fuzz found it: a client that pipelines and hangs up crashed the daemon).
        while !closed, !taskRunning, !state.isStopping || session.interactive.holdsStore, !replies.isFull, replies.isWritable {
            let length: Int
            switch input.next() {
            case .needMore: return
            case .tooLarge: refuseInput(Errors.limitExceeded("requestBytes", maximum: limits.maxRequestBytes)); return
            case .message(let found): length = found
            }
            let end = input.offset(afterMessageOf: length)
            let descriptors = passed.take(upTo: end)
            let stopping = state.isStopping
            let route = input.withMessage(length: length) { bytes in session.handle(bytes, descriptors: descriptors, stopping: stopping) }
            switch route {
            case .later:
                // Waits for the replies before it: handled again later, with its descriptors.
                passed.putBack(descriptors, at: end)
                input.keep()
                return
            case .done: break
            case .task(let start): startTask(start)
            }
            input.consume(length)
            if replies.readyBytes >= ReplyQueue.flushThreshold { flushOut() }
        }
    }

    /// Drops the input and answers `error` (a message over the limit, or one that stalled);
    /// then the connection closes.
    private func refuseInput(_ error: VarlinkError) {
        input.discard()
        partialSince = nil
        stop()
        replies.append(error)
    }

    // MARK: Calls run in a task

    /// Starts work the session handed back to run alone (a call for the router, a stream relayed
    /// from another host): earlier replies go first, and nothing else starts until it ends.
    private func startTask(_ start: Session.TaskStart) {
        taskRunning = true
        flushOut() // earlier replies go first
        let loop = self.loop
        start({ [self] bytes in try await sendFromTask(bytes) }, {
            loop.execute { [self] in
                taskRunning = false
                if !closed { resume() }
            }
        })
    }

    /// A reply from a task: sent in order (the task runs alone), and the task waits while the
    /// client does not read (a long streamed reply never piles up in memory).
    func sendFromTask(_ bytes: [UInt8]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            loop.execute { [self] in
                guard !closed else { continuation.resume(throwing: TransportError.closed); return }
                replies.append { $0.bytes.append(contentsOf: bytes) }
                flushOut()
                // What the socket did not take waits for EPOLLOUT, which must be asked for here:
                // nothing else runs resume() while the task does (reading is paused).
                if !closed { updateInterest() }
                if closed {
                    continuation.resume(throwing: TransportError.closed)
                } else if replies.isWritable {
                    continuation.resume()
                } else {
                    if sendWaiters.isEmpty { sendBlockedSince = StoreClock.now() }
                    sendWaiters.append(continuation)
                }
            }
        }
    }

    // MARK: Sweeps and shutdown

    /// Closes a connection that stalled: part of a message and nothing more for
    /// `limits.requestReadSeconds` (told `LimitExceeded`, limit `requestSeconds`), or nothing at
    /// all for `limits.idleConnectionSeconds`. Called by its loop's periodic sweep.
    func sweep(now: UInt64) {
        assert(loop.inEventLoop)
        guard !closed else { return }
        // A streamed reply (a streamed Query holds its user's store) whose client stopped
        // reading for limits.transactionMilliseconds: closing ends the call and frees the store.
        if let since = sendBlockedSince, now - since > UInt64(limits.transactionMilliseconds) * 1_000_000 {
            closeNow()
            return
        }
        if let since = partialSince, now - since > UInt64(limits.requestReadSeconds) * 1_000_000_000 {
            refuseInput(Errors.limitExceeded("requestSeconds", maximum: limits.requestReadSeconds))
            resume()
            return
        }
        session.sweep(now: now)
        let idle = replies.isInOrder && !taskRunning && input.isEmpty && session.isIdle
        if idle, peer.forwardedFrom == nil, now - lastActivity > UInt64(limits.idleConnectionSeconds) * 1_000_000_000 {
            closeNow()
        }
    }

    /// Asks the connection to end (graceful shutdown): idle, it closes now; busy, once the calls
    /// it started have replied.
    func quiesce() {
        assert(loop.inEventLoop)
        guard !closed else { return }
        stop()
        resume()
    }

    private func stop() {
        if !state.isStopping, !closed { state = .stopping(inputClosed: state.clientClosed) }
    }

    // MARK: Progress

    private var shouldPauseReading: Bool {
        taskRunning || (state.isStopping && !session.interactive.holdsStore) || replies.isFull || !replies.isWritable
    }

    /// After anything that may unblock progress: handles buffered calls; at the end of the
    /// loop's turn (``turnEnded()``), sends the replies, reads again or stops reading, closes
    /// when done.
    func resume() {
        assert(loop.inEventLoop)
        guard !closed else { return }
        processInput()
        guard !closed, !turnEndAsked else { return }
        turnEndAsked = true
        loop.atEndOfTurn(self)
    }

    func turnEnded() {
        turnEndAsked = false
        guard !closed else { return }
        flushOut()
        guard !closed else { return }
        if closeIfDone() { return }
        updateInterest()
    }

    private func updateInterest() {
        var wanted: UInt32 = 0
        if !shouldPauseReading && !state.clientClosed { wanted |= EPOLLIN.rawValue }
        // A message's read time counts only while the daemon waits for the client: not while it
        // does not read itself (a task call, too many replies waiting, a client not reading).
        if wanted & EPOLLIN.rawValue == 0 {
            partialSince = nil
        } else if partialSince == nil, !input.isEmpty {
            partialSince = StoreClock.now()
        }
        if replies.hasUnsent { wanted |= EPOLLOUT.rawValue }
        if wanted != interest {
            interest = wanted
            loop.modify(descriptor, token: token, events: wanted)
        }
    }

    // MARK: Writing

    /// Writes the ready replies (what the socket does not take now waits for EPOLLOUT).
    private func flushOut() {
        guard !closed else { return }
        if !replies.flush(to: descriptor) { closeNow() }
    }

    /// Sends what the socket did not take before, and wakes tasks waiting to send.
    private func writeUnsent() {
        guard replies.writeUnsent(to: descriptor) else { return closeNow() }
        if replies.isWritable, !sendWaiters.isEmpty {
            let waiters = sendWaiters
            sendWaiters.removeAll()
            sendBlockedSince = nil
            for waiter in waiters { waiter.resume() }
        }
    }

    // MARK: Closing

    /// Closes when the connection is to end and every started call has replied; true if it did.
    private func closeIfDone() -> Bool {
        guard state != .serving, !processing, !taskRunning, replies.isInOrder else { return false }
        // At shutdown, an open transaction may still commit (its time limits bound the wait).
        if state == .stopping(inputClosed: false), session.interactive.holdsStore { return false }
        // After the client's close, calls still complete in the input are answered first.
        if state == .inputClosed, !input.isEmpty, input.holdsWholeMessage { return false }
        // Let the socket take the rest first; a client that never reads is cut off by its own close.
        if replies.hasUnsent { return false }
        closeNow()
        return true
    }

    /// Closes the socket now; replies still to come are dropped.
    private func closeNow() {
        guard !closed else { return }
        state = .closed
        session.end()
        loop.unregister(descriptor, token: token)
        close(descriptor)
        passed.closeAll()
        input.release()
        replies.close()
        replies.onDelivery = {}
        let waiters = sendWaiters
        sendWaiters.removeAll()
        for waiter in waiters { waiter.resume(throwing: TransportError.closed) }
        tracker.remove(self)
    }
}
