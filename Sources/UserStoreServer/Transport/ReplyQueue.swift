import Synchronization
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// The replies of one connection, in request order, and the bytes its socket has not taken:
/// the reply writer at the end of the pipeline.
///
/// A reply is either *ready* (written into ``out`` behind every earlier one) or *reserved*
/// (``reserve()``: a ``QueuedReply`` that a store's queue, a transaction or another host will
/// fill in later). A ready reply behind a reserved one waits for it: replies leave in request
/// order whatever finishes first.
///
/// Confined to its connection's event loop (asserted in debug builds); other threads reach it
/// only through a ``QueuedReply``, which hops to the loop — hence `@unchecked Sendable`.
final class ReplyQueue: @unchecked Sendable {
    /// Replies waiting behind an earlier one beyond this: the connection stops reading.
    static let maxPendingReplies = 256
    /// Unsent bytes beyond this: the client is not reading; the connection stops reading.
    static let highWatermark = 256 * 1024
    /// Ready replies are written out once they reach this size, even mid-read.
    static let flushThreshold = 64 * 1024

    let loop: EventLoop
    /// Told (on the loop) when a reserved reply arrived: progress may be possible.
    var onDelivery: () -> Void = {}

    /// Ready replies behind nothing, not handed to the socket yet.
    private var out = JSONWriter(capacity: 4096)
    /// Bytes the socket did not take yet: `unsent[unsentStart...]`.
    private var unsent: [UInt8] = []
    private var unsentStart = 0
    /// Replies behind a reserved one still being computed, in order.
    private var pending: [Pending] = []
    private struct Pending {
        let reserved: QueuedReply?
        var bytes: [UInt8]?
    }
    private var closed = false

    init(loop: EventLoop) {
        self.loop = loop
    }

    /// Nothing reserved is outstanding: a new reply goes straight to ``out``.
    var isInOrder: Bool { pending.isEmpty }
    /// Too many replies wait behind a reserved one: stop reading calls.
    var isFull: Bool { pending.count >= Self.maxPendingReplies }
    /// The client reads its replies (the unsent bytes are below the high watermark).
    var isWritable: Bool { unsent.count - unsentStart < Self.highWatermark }
    /// Reply bytes held for the client: ready, unsent, and waiting behind a reserved one.
    var heldBytes: Int { out.bytes.count + unsent.count - unsentStart + pending.reduce(0) { $0 + ($1.bytes?.count ?? 0) } }
    /// Bytes of ready replies not handed to the socket yet.
    var readyBytes: Int { out.bytes.count }
    /// Bytes wait for the socket (EPOLLOUT).
    var hasUnsent: Bool { unsentStart < unsent.count }

    /// Appends `error` as the next reply.
    func append(_ error: VarlinkError) {
        append { VarlinkReply.encode(error, into: &$0) }
    }

    /// Appends what `body` writes, if anything, as the next reply (behind reserved ones if
    /// there are any). `body` may instead ``reserve()`` the reply's place.
    func append(_ body: (inout JSONWriter) -> Void) {
        assert(loop.inEventLoop)
        if pending.isEmpty { return body(&out) }
        var writer = JSONWriter(capacity: 256)
        body(&writer)
        if !writer.bytes.isEmpty { pending.append(Pending(reserved: nil, bytes: writer.bytes)) }
    }

    /// Reserves the next reply's place; the returned ``QueuedReply`` fills it in later.
    func reserve() -> QueuedReply {
        assert(loop.inEventLoop)
        let reply = QueuedReply(replies: self)
        pending.append(Pending(reserved: reply, bytes: nil))
        return reply
    }

    /// A reserved reply arrived (on the loop): it and the ready ones behind it move to ``out``.
    func deliver(_ reply: QueuedReply, _ bytes: [UInt8]) {
        assert(loop.inEventLoop)
        reply.recordOutcome(bytes)
        guard !closed, let index = pending.firstIndex(where: { $0.reserved === reply }) else { return }
        pending[index].bytes = bytes
        var ready = 0
        while ready < pending.count, let bytes = pending[ready].bytes {
            out.bytes.append(contentsOf: bytes)
            ready += 1
        }
        pending.removeFirst(ready)
        onDelivery()
    }

    // MARK: Writing to the socket

    /// Hands the ready replies to `descriptor` (what it does not take now waits for EPOLLOUT).
    /// False when the socket failed.
    func flush(to descriptor: Int32) -> Bool {
        assert(loop.inEventLoop)
        guard !out.bytes.isEmpty, !closed else { return true }
        if unsentStart == unsent.count {
            guard let written = out.bytes.withUnsafeBytes({ Self.send($0, to: descriptor) }) else { return false }
            if written < out.bytes.count {
                unsent.removeAll(keepingCapacity: true)
                unsentStart = 0
                unsent.append(contentsOf: out.bytes[written...])
            }
        } else {
            unsent.append(contentsOf: out.bytes)
        }
        if out.bytes.capacity > 1 << 20 { out = JSONWriter(capacity: 4096) } else { out.bytes.removeAll(keepingCapacity: true) }
        return true
    }

    /// Sends what the socket did not take before. False when the socket failed.
    func writeUnsent(to descriptor: Int32) -> Bool {
        assert(loop.inEventLoop)
        guard unsentStart < unsent.count else { return true }
        let written = unsent.withUnsafeBytes { buffer in Self.send(UnsafeRawBufferPointer(rebasing: buffer[unsentStart...]), to: descriptor) }
        guard let written else { return false }
        unsentStart += written
        if unsentStart == unsent.count {
            if unsent.capacity > 1 << 20 { unsent = [] } else { unsent.removeAll(keepingCapacity: true) }
            unsentStart = 0
        }
        return true
    }

    /// Drops every reply (the connection closed): reserved ones arriving later are ignored.
    func close() {
        assert(loop.inEventLoop)
        closed = true
        pending.removeAll()
        out.bytes.removeAll()
        unsent = []
        unsentStart = 0
    }

    /// `send(2)` as much as the socket takes; nil on an error.
    private static func send(_ bytes: UnsafeRawBufferPointer, to descriptor: Int32) -> Int? {
        var total = 0
        while total < bytes.count {
            let sent = Glibc.send(descriptor, bytes.baseAddress! + total, bytes.count - total, Int32(MSG_NOSIGNAL))
            if sent > 0 { total += sent; continue }
            if sent < 0 && errno == EINTR { continue }
            if sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
            return nil
        }
        return total
    }
}

/// A reply that a store's serial queue (or a transaction, or another host) will produce,
/// delivered to its connection's event loop and sent in its turn.
final class QueuedReply: Sendable {
    private let replies: ReplyQueue
    /// Metrics of the call, when it is measured here: its handles and its start.
    private let measured = Mutex<(DaemonMetrics.RequestHandles, UInt64)?>(nil)

    fileprivate init(replies: ReplyQueue) {
        self.replies = replies
    }

    /// Records the call in `handles` when its reply arrives.
    func measure(_ handles: DaemonMetrics.RequestHandles) {
        measured.withLock { $0 = (handles, StoreClock.now()) }
    }

    /// Records the call's outcome, if it is measured here.
    fileprivate func recordOutcome(_ bytes: [UInt8]) {
        guard let (handles, started) = measured.withLock({ $0 }) else { return }
        handles.record(outcome: DaemonMetrics.outcome(of: bytes[...]), nanoseconds: StoreClock.now() - started)
    }

    /// Hands over the reply (from any thread).
    func complete(_ bytes: [UInt8]) {
        let replies = self.replies
        replies.loop.execute { replies.deliver(self, bytes) }
    }

    /// Hands over the reply on the loop's thread (no hop).
    func completeOnLoop(_ bytes: [UInt8]) {
        replies.deliver(self, bytes)
    }
}
