import CUnixSocket
import Logging
import Synchronization
import UserStoreConfiguration
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// One client connection, served on its ``EventLoop``.
///
/// - **Framing**: NUL-terminated messages are cut from the input as it arrives; a message
///   longer than `limits.maxRequestBytes` gets `LimitExceeded` and the connection is closed
///   (nothing beyond the limit is ever buffered). File descriptors passed with a call
///   (`SCM_RIGHTS`) go with the message they arrived with.
/// - **Pipelining**: every complete call in the input is handled at once, and the replies of
///   one read go out in one write. A client may send many calls without waiting.
/// - **Order**: replies leave in request order. Calls answered on the event loop
///   (``FastPath``) and calls queued on their store's serial queue may be in flight together:
///   a reply that is ready waits behind an earlier one that is not. A call the fast path does
///   not take runs the ``RequestRouter`` in a task, alone: it starts when every earlier reply
///   is out, and later calls wait for it. Per store, statements keep arrival order (the store's
///   queue, and the fast path runs only on an idle store).
/// - **Backpressure**: the socket is not read while a task call runs, while too many replies
///   are pending, or while the client does not read its replies.
/// - **End**: a client that closes its sending side gets the replies to what it sent first; at
///   graceful shutdown (``quiesce()``) calls not yet started are dropped and the connection
///   closes once the started ones have replied.
///
/// Thread-safety: confined to its loop's thread; other threads reach it only through
/// `loop.execute` (``QueuedReply``, task replies), hence `@unchecked Sendable`.
final class Connection: EventHandler, @unchecked Sendable {
    /// What every connection shares.
    struct Shared: Sendable {
        let context: DaemonContext
        let fastPath: FastPath
        let router: RequestRouter
        let logger: Logger
        /// Sends calls for users another host owns to that host (`cluster.forward`).
        let forwarder: Forwarder?
    }

    /// Replies waiting for an earlier one beyond this: stop reading the socket.
    static let maxPendingReplies = 256
    /// Unsent reply bytes beyond this: the client is not reading; stop reading its calls.
    static let highWatermark = 256 * 1024
    /// Ready replies are written out once they reach this size, even mid-read.
    static let flushThreshold = 64 * 1024
    /// Descriptors accepted with one read (more are closed by the kernel shim).
    static let maxPassedDescriptors = 16

    let descriptor: Int32
    let loop: EventLoop
    let shared: Shared
    let peer: PeerIdentity
    private(set) var limits: RequestLimits
    private var tape: JSONTape
    private var token: UInt64 = 0
    private var interest: UInt32 = 0

    /// Received bytes not handled yet: `input[inputStart..<inputEnd]`.
    private var input: [UInt8] = []
    private var inputStart = 0, inputEnd = 0
    /// Cuts messages from the input (and remembers how far it searched).
    private var framer: MessageFramer
    /// Stream offset of `input[0]`, to place passed descriptors.
    private var inputOrigin = 0
    /// Descriptors received, each with the stream offset of the last byte of the read it came
    /// with; a message owns those within its bytes.
    private var passed: [(offset: Int, descriptor: Int32)] = []

    /// Replies ready to go, in order, behind nothing.
    private var out = JSONWriter(capacity: 4096)
    /// Bytes the socket did not take yet: `unsent[unsentStart...]`.
    private var unsent: [UInt8] = []
    private var unsentStart = 0
    /// Replies behind one still being computed on a store's queue, in order.
    private(set) var pending: [Pending] = []
    struct Pending {
        let queued: QueuedReply?
        var bytes: [UInt8]?
    }
    /// Task replies waiting for the client to read (backpressure on a streamed reply).
    private var sendWaiters: [CheckedContinuation<Void, any Error>] = []
    /// Since when a task's reply has waited for the client to read (nil: it is not waiting).
    private var sendBlockedSince: UInt64?
    /// A call runs in a task; nothing else starts until it ends.
    var taskRunning = false
    /// Handle no more input (shutdown, an oversized message): close once started calls replied.
    private var stopping = false
    /// The client closed its side: answer what it sent, then close.
    private var inputClosed = false
    private var processing = false
    private(set) var closed = false
    /// This connection's interactive transaction (see Connection+Transactions.swift).
    var transaction: OpenTransaction?
    /// This connection's links to the hosts it forwarded calls to, and the transactions open
    /// there (created by its first forwarded call; see Connection+Forwarding.swift).
    var forwarding: ForwardingLinks?
    /// When a byte last arrived (for `limits.idleConnectionSeconds`).
    private var lastActivity = StoreClock.now()
    /// Since when the input holds part of a message (for `limits.requestReadSeconds`).
    private var partialSince: UInt64?

    private init(descriptor: Int32, loop: EventLoop, shared: Shared, peer: PeerIdentity, settings: RuntimeSettings) {
        self.descriptor = descriptor
        self.loop = loop
        self.shared = shared
        self.peer = peer
        self.limits = settings.limits
        self.tape = JSONTape(maxDepth: settings.limits.maxJSONDepth)
        self.framer = MessageFramer(maxMessageBytes: settings.limits.maxRequestBytes)
    }

    /// Serves a connection just accepted on `loop` (on its thread): reads the peer's
    /// credentials, applies the access rules and the connection limit.
    /// A connection from another daemon (`forwarded`, joined by the ``PeerListener``) is
    /// served as that `peer` instead; it counts against `limits.maxConnections` but no Unix
    /// user's, and is never closed for idleness (its daemon closes it with its client's).
    static func start(_ descriptor: Int32, loop: EventLoop, shared: Shared, peer forwarded: PeerIdentity? = nil) {
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
            let groups = PeerCredentials.groups(of: uid, primary: gid)
            peer = PeerIdentity(uid: uid, gid: gid, pid: pid, grant: settings.access.grant(uid: uid, gid: gid, groups: groups))
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

    // MARK: Events

    func ready(_ events: UInt32) {
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
            guard !closed, !shouldPauseReading, !inputClosed else { return }
            makeRoomForInput()
            let room = input.count - inputEnd
            var descriptors = [Int32](repeating: -1, count: Self.maxPassedDescriptors)
            var count: Int32 = 0
            let received = input.withUnsafeMutableBytes { buffer in
                descriptors.withUnsafeMutableBufferPointer { fds in
                    us_recv_with_fds(descriptor, buffer.baseAddress! + inputEnd, room, fds.baseAddress, Int32(Self.maxPassedDescriptors), &count)
                }
            }
            if received < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { return }
                closeNow()
                return
            }
            if received == 0 {
                inputClosed = true
                processInput()
                return
            }
            inputEnd += received
            lastActivity = StoreClock.now()
            for index in 0..<Int(count) { passed.append((inputOrigin + inputEnd - 1, descriptors[index])) }
            processInput()
            // Part of a message waits for the rest: its time is counted from now on.
            if inputEnd > inputStart { partialSince = partialSince ?? lastActivity } else { partialSince = nil }
            if received < room { return } // the socket is likely drained
        }
    }

    /// Ensures free space after `inputEnd`: moves unread bytes to the front, or grows the
    /// buffer (never beyond one maximal message and a read).
    private func makeRoomForInput() {
        if inputStart == inputEnd {
            inputOrigin += inputStart
            inputStart = 0
            inputEnd = 0
            if input.count > 1 << 20 { input = [] } // a large message made it big
        }
        if input.isEmpty { input = [UInt8](repeating: 0, count: 16_384) }
        if input.count - inputEnd >= 4096 { return }
        if inputStart > 0 {
            input.withUnsafeMutableBytes { buffer in
                _ = memmove(buffer.baseAddress!, buffer.baseAddress! + inputStart, inputEnd - inputStart)
            }
            inputOrigin += inputStart
            inputEnd -= inputStart
            inputStart = 0
            if input.count - inputEnd >= 4096 { return }
        }
        let limit = limits.maxRequestBytes + 65_536
        input.append(contentsOf: repeatElement(0, count: min(max(input.count, 16_384), max(limit - input.count, 4096))))
    }

    // MARK: Handling calls

    /// Handles every complete call in the input, while nothing blocks progress.
    private func processInput() {
        guard !processing, !closed else { return }
        processing = true
        defer { processing = false }
        // At shutdown, a connection whose transaction holds a store goes on: its calls may still
        // commit it (the others are refused).
        // `closed` is checked on every turn: a write failing inside the loop (the flush below, or
        // a reply the handler sent) closes the connection and empties `input` under our feet
        // (the live fuzz found it: a client that pipelines and hangs up crashed the daemon).
        while !closed, !taskRunning, !stopping || holdsTransaction, pending.count < Self.maxPendingReplies, isWritable {
            let next = input.withUnsafeBytes { buffer in
                framer.next(in: UnsafeRawBufferPointer(rebasing: buffer[inputStart..<inputEnd]))
            }
            let length: Int
            switch next {
            case .needMore: return
            case .tooLarge: tooLarge(); return
            case .message(let found): length = found
            }
            let end = inputStart + length
            let descriptors = takeDescriptors(upTo: inputOrigin + end)
            let handled = input.withUnsafeBufferPointer { buffer in
                handle(UnsafeBufferPointer(rebasing: buffer[inputStart..<end]), descriptors: descriptors)
            }
            guard handled else {
                // Waits for the replies before it: handled again later, with its descriptors.
                passed.insert(contentsOf: descriptors.map { (inputOrigin + end, $0) }, at: 0)
                framer.reset()
                return
            }
            inputStart = end + 1
            if out.bytes.count >= Self.flushThreshold { flushOut() }
        }
    }

    /// The descriptors that came with the bytes up to stream offset `end`.
    private func takeDescriptors(upTo end: Int) -> [Int32] {
        guard let first = passed.first, first.offset <= end else { return [] }
        let count = passed.prefix { $0.offset <= end }.count
        defer { passed.removeFirst(count) }
        return passed.prefix(count).map(\.descriptor)
    }

    /// A message over the limit: answered with `LimitExceeded`, then the connection closes.
    private func tooLarge() {
        inputStart = inputEnd
        framer.reset()
        stopping = true
        appendReply(Errors.limitExceeded("requestBytes", maximum: limits.maxRequestBytes))
    }

    /// Handles one message; false when it must wait until every earlier reply is out (it then
    /// stays in the input and is handled again later). Takes ownership of `descriptors`.
    private func handle(_ bytes: UnsafeBufferPointer<UInt8>, descriptors: [Int32]) -> Bool {
        do {
            try tape.parse(bytes)
        } catch {
            descriptors.forEach { close($0) }
            appendReply(VarlinkError.invalidRequest("\(error)"))
            shared.context.metrics?.requestHandles(method: "").record(outcome: "InvalidRequest", nanoseconds: 0)
            return true
        }
        // Another host owns the user (or holds the transaction the call names): sent there.
        if let forwarder = shared.forwarder, peer.forwardedFrom == nil,
           let target = tape.withView(bytes, { forwarder.target(of: $0, peer: peer, transactions: forwarding?.transactions ?? [:]) }) {
            if stopping { // a transaction open on another host ends with the link: rolled back there
                descriptors.forEach { close($0) }
                appendReply(Errors.shuttingDown)
                return true
            }
            let handled = tape.withView(bytes) { forward($0, bytes, to: target) }
            // No io.userstore.Store call takes descriptors; a call that waits keeps its own.
            if handled { descriptors.forEach { close($0) } }
            return handled
        }
        if let kind = tape.withView(bytes, { Self.transactionCall($0) }) {
            descriptors.forEach { close($0) }
            tape.withView(bytes) { handleTransaction(kind, $0) }
            return true
        }
        if stopping {
            descriptors.forEach { close($0) }
            appendReply(Errors.shuttingDown)
            return true
        }
        if transaction != nil, let error = tape.withView(bytes, { waitsForOwnTransaction($0) }) {
            descriptors.forEach { close($0) }
            // Shutdown may have begun before this connection's loop got to quiesce it
            // (`stopping`): the call would be refused for that anyway, as the router does.
            appendReply(shared.context.isShuttingDown ? Errors.shuttingDown : error)
            return true
        }
        let outcome: FastPath.Outcome
        if !descriptors.isEmpty {
            outcome = .slow // only task calls take descriptors
        } else if pending.isEmpty {
            outcome = tape.withView(bytes) { view in
                shared.fastPath.handle(view, peer: peer, limits: limits, into: &out, makeQueuedReply: makeQueuedReply)
            }
        } else {
            var scratch = JSONWriter(capacity: 256)
            outcome = tape.withView(bytes) { view in
                shared.fastPath.handle(view, peer: peer, limits: limits, into: &scratch, makeQueuedReply: makeQueuedReply)
            }
            if case .answered = outcome { pending.append(Pending(queued: nil, bytes: scratch.bytes)) }
        }
        switch outcome {
        case .answered, .queued:
            return true
        case .slow:
            guard pending.isEmpty else { return false }
            let call: VarlinkCall
            do {
                call = try tape.withView(bytes) { view throws(VarlinkError) in try VarlinkCall(message: view.value(0)) }
            } catch {
                descriptors.forEach { close($0) }
                appendReply(error)
                return true
            }
            runTask(Request(call: call, message: JSONMessage(bytes: Array(bytes), parsed: tape), descriptors: PassedDescriptors(descriptors)))
            return true
        }
    }

    /// Registers a reply that a store's queue will deliver, after every reply before it.
    func makeQueuedReply() -> QueuedReply {
        let queued = QueuedReply(connection: self)
        pending.append(Pending(queued: queued, bytes: nil))
        return queued
    }

    /// A reply from a store's queue (on the loop's thread).
    func deliver(_ queued: QueuedReply, _ bytes: [UInt8]) {
        queued.recordOutcome(bytes)
        guard !closed, let index = pending.firstIndex(where: { $0.queued === queued }) else { return }
        pending[index].bytes = bytes
        var ready = 0
        while ready < pending.count, let bytes = pending[ready].bytes {
            out.bytes.append(contentsOf: bytes)
            ready += 1
        }
        pending.removeFirst(ready)
        resume()
    }

    /// Runs a call the fast path did not take in a task of its own; nothing else starts
    /// until it ends.
    private func runTask(_ request: Request) {
        taskRunning = true
        flushOut() // earlier replies go first
        let router = shared.router, peer = self.peer, loop = self.loop
        let send: ReplySink = { [self] bytes in try await sendFromTask(bytes) }
        Task {
            try? await router.handle(request, peer: peer, send: send)
            request.descriptors.closeAll()
            loop.execute { [self] in
                taskRunning = false
                if !closed { resume() }
            }
        }
    }

    /// A reply from a task: sent in order (the task runs alone), and the task waits while the
    /// client does not read (a long streamed reply never piles up in memory).
    func sendFromTask(_ bytes: [UInt8]) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            loop.execute { [self] in
                guard !closed else { continuation.resume(throwing: TransportError.closed); return }
                out.bytes.append(contentsOf: bytes)
                flushOut()
                // What the socket did not take waits for EPOLLOUT, which must be asked for here:
                // nothing else runs resume() while the task does (reading is paused).
                if !closed { updateInterest() }
                if closed {
                    continuation.resume(throwing: TransportError.closed)
                } else if isWritable {
                    continuation.resume()
                } else {
                    if sendWaiters.isEmpty { sendBlockedSince = StoreClock.now() }
                    sendWaiters.append(continuation)
                }
            }
        }
    }

    /// Closes a connection that stalled: part of a message and nothing more for
    /// `limits.requestReadSeconds` (told `LimitExceeded`, limit `requestSeconds`), or nothing at
    /// all for `limits.idleConnectionSeconds`. Called by its loop's periodic sweep.
    func sweep(now: UInt64) {
        guard !closed else { return }
        // A streamed reply (a streamed Query holds its user's store) whose client stopped
        // reading for limits.transactionMilliseconds: closing ends the call and frees the store.
        if let since = sendBlockedSince, now - since > UInt64(limits.transactionMilliseconds) * 1_000_000 {
            closeNow()
            return
        }
        if let since = partialSince, now - since > UInt64(limits.requestReadSeconds) * 1_000_000_000 {
            inputStart = inputEnd
            framer.reset()
            partialSince = nil
            stopping = true
            appendReply(Errors.limitExceeded("requestSeconds", maximum: limits.requestReadSeconds))
            resume()
            return
        }
        forwarding?.sweep(now: now)
        let idle = pending.isEmpty && !taskRunning && !holdsTransaction && inputEnd == inputStart && forwarding?.isIdle != false
        if idle, peer.forwardedFrom == nil, now - lastActivity > UInt64(limits.idleConnectionSeconds) * 1_000_000_000 {
            closeNow()
        }
    }

    /// Asks the connection to end (graceful shutdown): idle, it closes now; busy, once the calls
    /// it started have replied.
    func quiesce() {
        guard !closed else { return }
        stopping = true
        resume()
    }

    // MARK: Progress

    private var shouldPauseReading: Bool {
        taskRunning || (stopping && !holdsTransaction) || pending.count >= Self.maxPendingReplies || !isWritable
    }

    private var isWritable: Bool { unsent.count - unsentStart < Self.highWatermark }

    /// After anything that may unblock progress: handles buffered calls, sends replies, reads
    /// again or stops reading, closes when done.
    func resume() {
        guard !closed else { return }
        processInput()
        flushOut()
        guard !closed else { return }
        if closeIfDone() { return }
        updateInterest()
    }

    private func updateInterest() {
        var wanted: UInt32 = 0
        if !shouldPauseReading && !inputClosed { wanted |= EPOLLIN.rawValue }
        if unsentStart < unsent.count { wanted |= EPOLLOUT.rawValue }
        if wanted != interest {
            interest = wanted
            loop.modify(descriptor, token: token, events: wanted)
        }
    }

    // MARK: Writing

    /// Appends `error` as the next reply.
    func appendReply(_ error: VarlinkError) {
        if pending.isEmpty {
            VarlinkReply.encode(error, into: &out)
        } else {
            pending.append(Pending(queued: nil, bytes: VarlinkReply.encode(error)))
        }
    }

    /// Writes the ready replies (what the socket does not take now waits for EPOLLOUT).
    func flushOut() {
        guard !out.bytes.isEmpty, !closed else { return }
        if unsentStart == unsent.count {
            let written = out.bytes.withUnsafeBytes { write($0) }
            guard let written else { return }
            if written < out.bytes.count {
                unsent.removeAll(keepingCapacity: true)
                unsentStart = 0
                unsent.append(contentsOf: out.bytes[written...])
            }
        } else {
            unsent.append(contentsOf: out.bytes)
        }
        if out.bytes.capacity > 1 << 20 { out = JSONWriter(capacity: 4096) } else { out.bytes.removeAll(keepingCapacity: true) }
    }

    /// Sends what the socket did not take before.
    private func writeUnsent() {
        guard unsentStart < unsent.count else { return }
        let written = unsent.withUnsafeBytes { buffer in write(UnsafeRawBufferPointer(rebasing: buffer[unsentStart...])) }
        guard let written else { return }
        unsentStart += written
        if unsentStart == unsent.count {
            if unsent.capacity > 1 << 20 { unsent = [] } else { unsent.removeAll(keepingCapacity: true) }
            unsentStart = 0
        }
        if isWritable, !sendWaiters.isEmpty {
            let waiters = sendWaiters
            sendWaiters.removeAll()
            sendBlockedSince = nil
            for waiter in waiters { waiter.resume() }
        }
    }

    /// `send(2)` as much as the socket takes; nil (and the connection closed) on an error.
    private func write(_ bytes: UnsafeRawBufferPointer) -> Int? {
        var total = 0
        while total < bytes.count {
            let sent = send(descriptor, bytes.baseAddress! + total, bytes.count - total, Int32(MSG_NOSIGNAL))
            if sent > 0 { total += sent; continue }
            if sent < 0 && errno == EINTR { continue }
            if sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
            closeNow()
            return nil
        }
        return total
    }

    // MARK: Closing

    /// Closes when the connection is to end and every started call has replied; true if it did.
    private func closeIfDone() -> Bool {
        guard stopping || inputClosed, !processing, !taskRunning, pending.isEmpty else { return false }
        // At shutdown, an open transaction may still commit (its time limits bound the wait).
        if stopping, !inputClosed, holdsTransaction { return false }
        // After the client's close, calls still complete in the input are answered first.
        if inputClosed, !stopping, inputEnd > inputStart, input[inputStart..<inputEnd].contains(0) { return false }
        if unsentStart < unsent.count {
            // Let the socket take the rest first; a client that never reads is cut off by its own close.
            return false
        }
        closeNow()
        return true
    }

    /// Closes the socket now; replies still to come are dropped.
    private func closeNow() {
        guard !closed else { return }
        closed = true
        abandonTransaction()
        forwarding?.closeAll()
        forwarding = nil
        loop.unregister(descriptor, token: token)
        close(descriptor)
        for (_, passedDescriptor) in passed { close(passedDescriptor) }
        passed.removeAll()
        pending.removeAll()
        input = []
        inputStart = 0
        inputEnd = 0
        out.bytes.removeAll()
        unsent = []
        unsentStart = 0
        let waiters = sendWaiters
        sendWaiters.removeAll()
        for waiter in waiters { waiter.resume(throwing: TransportError.closed) }
        shared.context.connections.remove(self)
    }
}

/// A reply that a store's serial queue will produce, delivered to its connection's event loop
/// and sent in its turn.
final class QueuedReply: Sendable {
    private let connection: Connection
    /// Metrics of the call, when it is measured here: its handles and its start.
    private let measured = Mutex<(DaemonMetrics.RequestHandles, UInt64)?>(nil)

    init(connection: Connection) {
        self.connection = connection
    }

    /// Records the call in `handles` when its reply arrives.
    func measure(_ handles: DaemonMetrics.RequestHandles) {
        measured.withLock { $0 = (handles, StoreClock.now()) }
    }

    /// Records the call's outcome, if it is measured here.
    func recordOutcome(_ bytes: [UInt8]) {
        guard let (handles, started) = measured.withLock({ $0 }) else { return }
        handles.record(outcome: DaemonMetrics.outcome(of: bytes[...]), nanoseconds: StoreClock.now() - started)
    }

    /// Hands over the reply (from any thread).
    func complete(_ bytes: [UInt8]) {
        let connection = self.connection
        connection.loop.execute { connection.deliver(self, bytes) }
    }
}
