import Logging
import NIOCore
import UserStoreConfiguration
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// One client connection, served on its channel's event loop.
///
/// - **Framing**: NUL-terminated messages are cut from the input as it arrives; a message
///   longer than `limits.maxRequestBytes` gets `LimitExceeded` and the connection is closed
///   (nothing beyond the limit is ever buffered).
/// - **Pipelining**: every complete call in the input is handled at once, and the replies of
///   one read burst go out in one write. A client may send many calls without waiting.
/// - **Order**: replies leave in request order. Calls answered on the event loop
///   (``FastPath``) and calls queued on their store's serial queue may be in flight together:
///   a reply that is ready waits behind an earlier one that is not. A call the fast path does
///   not take runs the ``RequestRouter`` in a task, alone: it starts when every earlier reply
///   is out, and later calls wait for it. Per store, statements keep arrival order (the store's
///   queue, and the fast path runs only on an idle store).
/// - **Backpressure**: the socket is not read while a task call runs, while too many replies
///   are pending, or while the client does not read its replies (channel not writable).
/// - **End**: a client that closes its side gets the replies to what it sent first; at
///   graceful shutdown (``ChannelShouldQuiesceEvent``) calls not yet started are dropped and
///   the connection closes once the started ones have replied.
final class ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What every connection shares.
    struct Shared: Sendable {
        let context: DaemonContext
        let fastPath: FastPath
        let router: RequestRouter
        let logger: Logger
    }

    /// Replies waiting for an earlier one beyond this: stop reading the socket.
    static let maxPendingReplies = 256
    /// Ready replies are written out once they reach this size, even mid-burst.
    static let flushThreshold = 64 * 1024

    private let shared: Shared
    private let credentials: PeerCredentials?
    private var peer: PeerIdentity?
    private var limits: RequestLimits
    private var tape: JSONTape

    private var input: ByteBuffer?
    /// Bytes of `input` already searched for a NUL (a long message arrives in many reads).
    private var scanned = 0
    /// Replies ready to go, in order, behind nothing.
    private var out = JSONWriter(capacity: 4096)
    /// Replies behind one still being computed on a store's queue, in order.
    private var pending = CircularBuffer<Pending>()
    private struct Pending {
        let queued: QueuedReply?
        var bytes: [UInt8]?
    }
    /// A call runs in a task; nothing else starts until it ends.
    private var taskRunning = false
    /// Handle no more input (shutdown, an oversized message): close once started calls replied.
    private var stopping = false
    /// The client closed its side: answer what it sent, then close.
    private var inputClosed = false
    private var readHeld = false
    private var processing = false
    private var admitted = false
    private var started = false
    private var context: ChannelHandlerContext?
    private var loopBound: NIOLoopBound<ConnectionHandler>?

    init(shared: Shared, credentials: PeerCredentials?) {
        self.shared = shared
        self.credentials = credentials
        let settings = shared.context.settings.withLock { $0 }
        self.limits = settings.limits
        self.tape = JSONTape(maxDepth: settings.limits.maxJSONDepth)
        if let credentials {
            peer = PeerIdentity(uid: credentials.uid, gid: credentials.gid, pid: credentials.pid,
                                grant: settings.access.grant(uid: credentials.uid, gid: credentials.gid, groups: credentials.groups))
        }
    }

    // MARK: Life cycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        if context.channel.isActive { start(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    /// Admits the connection (or refuses it at once).
    private func start(_ context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        guard peer != nil else { context.close(promise: nil); return }
        switch shared.context.connections.admit(context.channel, maximum: limits.maxConnections) {
        case .admitted:
            admitted = true
        case .full:
            VarlinkReply.encode(Errors.limitExceeded("connections", maximum: limits.maxConnections), into: &out)
            stopping = true
            flushOut(context)
            context.close(promise: nil)
        case .stopping:
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if admitted { shared.context.connections.remove(context.channel) }
        admitted = false
        input = nil
        pending.removeAll()
        out.bytes.removeAll()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        loopBound = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case is ChannelShouldQuiesceEvent:
            stopping = true
            closeIfDone(context)
        case ChannelEvent.inputClosed:
            inputClosed = true
            processInput(context)
            flushOut(context)
            closeIfDone(context)
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        shared.logger.debug("connection closed", metadata: ["error": "\(error)", "pid": "\(credentials?.pid ?? 0)"])
        context.close(promise: nil)
    }

    // MARK: Reading

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard admitted, !stopping else { return }
        if input == nil || input!.readableBytes == 0 {
            input = buffer
        } else {
            input!.writeBuffer(&buffer)
        }
        processInput(context)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flushOut(context)
        closeIfDone(context)
    }

    func read(context: ChannelHandlerContext) {
        if shouldPauseReading(context) {
            readHeld = true
        } else {
            context.read()
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { resume(context) }
        context.fireChannelWritabilityChanged()
    }

    private func shouldPauseReading(_ context: ChannelHandlerContext) -> Bool {
        taskRunning || stopping || pending.count >= Self.maxPendingReplies || !context.channel.isWritable
    }

    /// After something that blocked progress ended: handles buffered calls, sends replies,
    /// reads again.
    private func resume(_ context: ChannelHandlerContext) {
        processInput(context)
        flushOut(context)
        if readHeld, !shouldPauseReading(context) {
            readHeld = false
            context.read()
        }
        closeIfDone(context)
    }

    // MARK: Handling calls

    /// Handles every complete call in the input, while nothing blocks progress.
    private func processInput(_ context: ChannelHandlerContext) {
        guard !processing, var buffer = input else { return }
        processing = true
        input = nil // owned here while handling, so nothing copies it
        defer {
            if buffer.readableBytes == 0 {
                // Keep the storage unless a large message made it big.
                if buffer.capacity <= 1 << 20 { buffer.clear(); input = buffer } else { input = nil }
            } else {
                input = buffer
            }
            processing = false
        }
        while !taskRunning, !stopping, pending.count < Self.maxPendingReplies, context.channel.isWritable {
            let start = scanned
            let nul: Int? = buffer.withUnsafeReadableBytes { raw in
                guard raw.count > start, let found = memchr(raw.baseAddress! + start, 0, raw.count - start) else { return nil }
                return raw.baseAddress!.distance(to: UnsafeRawPointer(found))
            }
            guard let length = nul else {
                scanned = buffer.readableBytes
                if scanned > limits.maxRequestBytes { tooLarge(context, &buffer) }
                return
            }
            scanned = 0
            if length > limits.maxRequestBytes { tooLarge(context, &buffer); return }
            let handled = buffer.withUnsafeReadableBytes { raw in
                handle(context, UnsafeBufferPointer(start: raw.baseAddress!.assumingMemoryBound(to: UInt8.self), count: length))
            }
            guard handled else { return } // waits for the replies before it
            buffer.moveReaderIndex(forwardBy: length + 1)
            if out.bytes.count >= Self.flushThreshold { flushOut(context) }
        }
    }

    /// A message over the limit: answered with `LimitExceeded`, then the connection closes.
    private func tooLarge(_ context: ChannelHandlerContext, _ buffer: inout ByteBuffer) {
        buffer.moveReaderIndex(forwardBy: buffer.readableBytes)
        scanned = 0
        stopping = true
        appendReply(Errors.limitExceeded("requestBytes", maximum: limits.maxRequestBytes))
    }

    /// Handles one message; false when it must wait until every earlier reply is out (it then
    /// stays in the input and is handled again later).
    private func handle(_ context: ChannelHandlerContext, _ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        do {
            try tape.parse(bytes)
        } catch {
            appendReply(VarlinkError.invalidRequest("\(error)"))
            return true
        }
        let peer = self.peer!
        let outcome: FastPath.Outcome
        if pending.isEmpty {
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
                appendReply(error)
                return true
            }
            runTask(context, Request(call: call, message: JSONMessage(bytes: Array(bytes), parsed: tape)))
            return true
        }
    }

    /// Registers a reply that a store's queue will deliver, after every reply before it.
    private func makeQueuedReply() -> QueuedReply {
        let queued = QueuedReply(handler: loopBound!)
        pending.append(Pending(queued: queued, bytes: nil))
        return queued
    }

    /// A reply from a store's queue (on the event loop).
    fileprivate func deliver(_ queued: QueuedReply, _ bytes: [UInt8]) {
        guard let context, let index = pending.firstIndex(where: { $0.queued === queued }) else { return }
        pending[index].bytes = bytes
        while let first = pending.first, let ready = first.bytes {
            out.bytes.append(contentsOf: ready)
            pending.removeFirst()
        }
        resume(context)
    }

    /// Runs a call the fast path did not take in a task of its own; nothing else starts
    /// until it ends.
    private func runTask(_ context: ChannelHandlerContext, _ request: Request) {
        taskRunning = true
        flushOut(context) // earlier replies go first
        let channel = context.channel
        let send: ReplySink = { bytes in
            var buffer = channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            try await channel.writeAndFlush(buffer).get()
        }
        let loopBound = self.loopBound!, router = shared.router, peer = self.peer!
        Task {
            try? await router.handle(request, peer: peer, send: send)
            loopBound.eventLoop.execute {
                let handler = loopBound.value
                handler.taskRunning = false
                if let context = handler.context { handler.resume(context) }
            }
        }
    }

    // MARK: Writing

    /// Appends `error` as the next reply.
    private func appendReply(_ error: VarlinkError) {
        if pending.isEmpty {
            VarlinkReply.encode(error, into: &out)
        } else {
            pending.append(Pending(queued: nil, bytes: VarlinkReply.encode(error)))
        }
    }

    /// Writes the ready replies in one buffer.
    private func flushOut(_ context: ChannelHandlerContext) {
        guard !out.bytes.isEmpty else { return }
        if context.channel.isActive {
            var buffer = context.channel.allocator.buffer(capacity: out.bytes.count)
            buffer.writeBytes(out.bytes)
            context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        }
        if out.bytes.capacity > 1 << 20 { out = JSONWriter(capacity: 4096) } else { out.bytes.removeAll(keepingCapacity: true) }
    }

    /// Closes the connection when it is to end and every started call has replied.
    private func closeIfDone(_ context: ChannelHandlerContext) {
        guard stopping || inputClosed, !processing, !taskRunning, pending.isEmpty, context.channel.isActive else { return }
        if inputClosed, !stopping, let input, input.readableBytes > 0, input.readableBytesView.contains(0) { return }
        flushOut(context)
        context.close(promise: nil)
    }
}

/// A reply that a store's serial queue will produce, delivered to its connection's event loop
/// and sent in its turn.
final class QueuedReply: Sendable {
    private let handler: NIOLoopBound<ConnectionHandler>

    init(handler: NIOLoopBound<ConnectionHandler>) {
        self.handler = handler
    }

    /// Hands over the reply (from any thread).
    func complete(_ bytes: [UInt8]) {
        let handler = self.handler
        handler.eventLoop.execute { handler.value.deliver(self, bytes) }
    }
}
