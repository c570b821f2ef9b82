import CUnixSocket
import NIOCore
import Synchronization
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// Who takes a call's replies.
enum Responder: Sendable {
    /// One reply, handed over as its bytes (the caller parses it, on its own thread).
    case single(PendingReply)
    /// Replies until one comes without `continues` (a call with `more`).
    case stream(any StreamResponder)

    func fail(_ error: any Error) {
        switch self {
        case .single(let reply): reply.complete(.failure(error))
        case .stream(let sink): sink.fail(error)
        }
    }
}

/// One connection to the daemon's socket: varlink's client side, over the event loop the
/// daemon's own connections use (``EventLoop``).
///
/// Calls are written by the calling thread itself, straight to the socket (no hand-off to the
/// loop), and queued for their replies in the same critical section: since the daemon answers a
/// connection's calls in the order they came, each reply belongs to the oldest call still
/// waiting, and any number may be in flight (pipelining). The loop's thread reads the replies,
/// splits them at their NULs and hands each to its caller. Only what the socket would not take
/// at once waits for the loop (`EPOLLOUT`).
///
/// Thread-safety: ``send(_:to:)``, ``close(_:)``, ``resumeReading()`` and
/// ``isClosed`` from anywhere (the shared state is under `shared`); the reading side only on
/// the loop's thread, hence `@unchecked Sendable`.
final class ClientConnection: EventHandler, @unchecked Sendable {
    private struct Shared {
        var waiting = CircularBuffer<Responder>(initialCapacity: 16)
        /// Bytes the socket did not take yet.
        var output: [UInt8] = []
        /// Descriptors to pass with the call at `offset` of `output`, `length` bytes long: the
        /// connection's own copies (`dup`), closed once sent or dropped, because the caller may
        /// close its own as soon as it stops waiting (a cancelled call returns at once).
        var outputDescriptors: [(offset: Int, length: Int, descriptors: [Int32])] = []

        /// Forgets what was not written, closing the copies of its descriptors.
        mutating func dropOutput() {
            output = []
            for queued in outputDescriptors { for descriptor in queued.descriptors { Glibc.close(descriptor) } }
            outputDescriptors = []
        }
        /// Why the connection closed; set once, never cleared.
        var closed: UserStoreError?
        /// The descriptor was closed (by the loop): nothing may touch it any more.
        var released = false
        /// A stream's consumer has enough buffered: the loop stops reading.
        var paused = false
        /// The descriptor's registration with the loop (0: not registered).
        var token: UInt64 = 0
    }

    let descriptor: Int32
    private let loop: Varlink.EventLoop
    private let shared = Mutex(Shared())
    /// Told once, on the loop's thread, when the connection is gone.
    private let onClose: @Sendable (ClientConnection) -> Void

    // Loop-confined.
    /// Bytes read and not yet delivered.
    private var input: InputBuffer
    private var finished = false
    /// The daemon hung up while reading was paused: the rest is read when it resumes.
    private var hungUp = false
    /// The loop's own copy of `Shared.paused` (only the loop changes it), read without the lock.
    private var isPaused = false

    private init(descriptor: Int32, loop: Varlink.EventLoop, maxMessageBytes: Int, onClose: @escaping @Sendable (ClientConnection) -> Void) {
        self.descriptor = descriptor
        self.loop = loop
        input = InputBuffer(maxMessageBytes: maxMessageBytes)
        self.onClose = onClose
    }

    /// Connects to `path` and registers the connection with `loop`.
    ///
    /// The connect does not wait: a daemon whose listen backlog is full refuses it (`EAGAIN`),
    /// which the pool treats as any failed connect (back-off), rather than blocking the caller's thread.
    static func connect(to path: String, loop: Varlink.EventLoop, maxMessageBytes: Int,
                        onClose: @escaping @Sendable (ClientConnection) -> Void) async throws -> ClientConnection {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw TransportError.system("socket", errno) }
        let result = UnixSocketAddress.with(path: path) { address, length in Glibc.connect(descriptor, address, length) }
        if result != 0 {
            let code = result == nil ? ENAMETOOLONG : errno // a path longer than sun_path's 107 bytes
            Glibc.close(descriptor)
            throw TransportError.system("connect", code)
        }
        let connection = ClientConnection(descriptor: descriptor, loop: loop, maxMessageBytes: maxMessageBytes, onClose: onClose)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            loop.execute {
                do {
                    let token = try loop.register(descriptor, events: EPOLLIN.rawValue, connection)
                    connection.shared.withLock { $0.token = token }
                    continuation.resume()
                } catch {
                    Glibc.close(descriptor)
                    continuation.resume(throwing: error)
                }
            }
        }
        return connection
    }

    /// Whether the connection has closed (or is closing): one atomic load, for the pool's
    /// every look at its slots.
    var isClosed: Bool { closedFlag.load(ordering: .relaxed) }
    private let closedFlag = Atomic<Bool>(false)

    /// Sends `message` (a whole varlink message, NUL included) and queues `responder` for its
    /// replies. `descriptors` go with the message's first byte (`SCM_RIGHTS`, as the daemon's
    /// `ImportStore` takes a file); they stay the caller's (what has to wait is sent from copies).
    ///
    /// - Throws: ``NotSent`` when nothing of the message went out (the connection had closed):
    ///   the call did not run, and may be sent elsewhere.
    func send(_ message: [UInt8], descriptors: [Int32] = [], to responder: Responder) throws(NotSent) {
        try shared.withLock { (shared: inout Shared) throws(NotSent) in
            guard shared.closed == nil else { throw NotSent() }
            shared.waiting.append(responder)
            guard shared.output.isEmpty else {
                if !descriptors.isEmpty { shared.outputDescriptors.append((shared.output.count, message.count, Self.copies(of: descriptors))) }
                shared.output.append(contentsOf: message)
                return
            }
            let written = message.withUnsafeBytes { bytes in
                descriptors.withUnsafeBufferPointer { fds in
                    us_send_with_fds(descriptor, bytes.baseAddress, bytes.count, fds.baseAddress, Int32(fds.count))
                }
            }
            if written == message.count { return }
            if written < 0 {
                let code = errno
                guard code == EAGAIN || code == EWOULDBLOCK || code == EINTR else {
                    shared.waiting.removeLast()
                    closeLocked(&shared, .closed("cannot write to the daemon: \(String(cString: strerror(code)))"))
                    throw NotSent()
                }
            }
            // Nothing went: the descriptors wait with the bytes (once any went, they went too).
            if written <= 0, !descriptors.isEmpty { shared.outputDescriptors.append((0, message.count, Self.copies(of: descriptors))) }
            shared.output.append(contentsOf: message[max(0, written)...])
            updateInterest(shared)
        }
    }

    /// Copies of `descriptors` that the connection owns (a copy that fails is -1, which the
    /// write then refuses with `EBADF`: the connection closes, and the call fails).
    private static func copies(of descriptors: [Int32]) -> [Int32] {
        descriptors.map { fcntl($0, F_DUPFD_CLOEXEC, 0) }
    }

    /// Closes the connection from any thread: calls waiting for replies fail with `error`; the
    /// loop releases the descriptor.
    func close(_ error: UserStoreError = .closed("the client closed the connection")) {
        let waiting = shared.withLock { shared -> CircularBuffer<Responder> in
            guard shared.closed == nil else { return [] }
            closeLocked(&shared, error)
            defer { shared.waiting.removeAll() }
            return shared.waiting
        }
        for responder in waiting { responder.fail(error) }
    }

    /// Marks the connection closed and shuts the socket down, which wakes the loop (`EPOLLHUP`)
    /// to release it. Under the lock, so the descriptor is still ours.
    private func closeLocked(_ shared: inout Shared, _ error: UserStoreError) {
        shared.closed = error
        closedFlag.store(true, ordering: .relaxed)
        shared.dropOutput()
        guard !shared.released else { return }
        Glibc.shutdown(descriptor, Int32(SHUT_RDWR))
        // Off epoll (the daemon hung up while a stream was paused), no event will come to
        // release the descriptor: the loop does it now.
        if shared.token == 0 { loop.execute { [self] in finish(nil) } }
    }

    /// A stream's consumer wants more: read again (on the loop).
    func resumeReading() {
        loop.execute { [self] in
            guard isPaused else { return }
            isPaused = false
            shared.withLock { shared in
                shared.paused = false
                updateInterest(shared)
            }
            guard !finished else { return }
            deliver()
            if hungUp, !isPaused { readAvailable() }
        }
    }

    private func updateInterest(_ shared: Shared) {
        guard !shared.released, shared.token != 0 else { return }
        var events: UInt32 = shared.paused ? 0 : EPOLLIN.rawValue
        if !shared.output.isEmpty { events |= EPOLLOUT.rawValue }
        loop.modify(descriptor, token: shared.token, events: events)
    }

    // MARK: On the loop's thread

    func ready(_ events: UInt32) {
        assert(loop.inEventLoop)
        if events & EPOLLOUT.rawValue != 0 { flush() }
        guard !finished else { return }
        if events & (EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0, isPaused {
            // Level-triggered, a hang-up would fire on every wait: stop watching, read the rest
            // when the consumer catches up (or release it now if we are the ones closing).
            hungUp = true
            let closedByUs = shared.withLock { shared -> Bool in
                guard shared.closed == nil else { return true }
                loop.unregister(descriptor, token: shared.token)
                shared.token = 0
                return false
            }
            if closedByUs { finish(nil) }
            return
        }
        if events & (EPOLLIN.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue) != 0 { readAvailable() }
    }

    private func flush() {
        shared.withLock { shared in
            guard !shared.output.isEmpty, shared.closed == nil else { return }
            // Writes until the socket is full, then drops what went in one move (not a copy of
            // the rest per write: a call of megabytes goes out in many writes).
            var sent = 0
            var failure: Int32?
            while sent < shared.output.count {
                // The daemon gives descriptors to the call that holds the last byte of the read
                // they came with, and a read ends with the write that carried them. So that write
                // starts at its call's first byte and ends within that call; and a write without
                // them stops before the next call that has some.
                let first = shared.outputDescriptors.first
                let passing = first?.offset == sent ? first!.descriptors : []
                let end = passing.isEmpty ? (first?.offset ?? shared.output.count) : sent + first!.length
                let length = end - sent
                let written = shared.output.withUnsafeBytes { bytes in
                    passing.withUnsafeBufferPointer { fds in
                        us_send_with_fds(descriptor, bytes.baseAddress! + sent, length, fds.baseAddress, Int32(fds.count))
                    }
                }
                if written < 0 {
                    let code = errno
                    if code != EAGAIN, code != EWOULDBLOCK, code != EINTR { failure = code }
                    break
                }
                if !passing.isEmpty {
                    for descriptor in passing { Glibc.close(descriptor) } // the kernel holds them now
                    shared.outputDescriptors.removeFirst()
                }
                sent += written
                if written < length { break } // the socket is full: EPOLLOUT says when to go on
            }
            shared.output.removeFirst(sent)
            for index in shared.outputDescriptors.indices { shared.outputDescriptors[index].offset -= sent }
            if let failure {
                // Not a full socket (which waits for EPOLLOUT): this connection cannot send,
                // and its calls cannot be answered. Closing fails them (the loop reads the
                // shut-down socket to its end) instead of spinning on EPOLLOUT.
                return closeLocked(&shared, .closed("cannot write to the daemon: \(String(cString: strerror(failure))); the calls sent before may have run"))
            }
            if shared.output.isEmpty { updateInterest(shared) }
        }
    }

    /// Reads what the socket holds and delivers every whole reply, until it would block, the
    /// daemon closes, or a stream's consumer has enough.
    private func readAvailable() {
        while !finished, !isPaused {
            var free = 0
            let received = input.withFreeSpace { space in
                free = space.count
                return read(descriptor, space.baseAddress!, space.count)
            }
            if received == 0 { return finish(.closed("the daemon closed the connection before replying; the call may or may not have run")) }
            if received < 0 {
                let code = errno
                if code == EAGAIN || code == EWOULDBLOCK { return }
                if code == EINTR { continue }
                return finish(.closed("cannot read from the daemon: \(String(cString: strerror(code))); the call may or may not have run"))
            }
            deliver()
            // A short read means the socket is drained, unless the daemon hung up: then the
            // descriptor is off epoll and only reading on to the end finds the EOF.
            if received < free, !hungUp { return }
        }
    }

    /// Hands each whole reply in `input` to its caller, while reading is not paused.
    private func deliver() {
        while !finished, !isPaused {
            switch input.next() {
            case .needMore:
                return
            case .tooLarge:
                return finish(.protocolViolation("a reply longer than \(input.maxMessageBytes) bytes"))
            case .message(let length):
                let message = input.withMessage(length: length) { [UInt8]($0) }
                input.consume(length)
                if let violation = dispatch(message) { return finish(violation) }
            }
        }
    }

    /// Gives `message` to the oldest waiting call; returns what is wrong when it cannot be.
    private func dispatch(_ message: [UInt8]) -> UserStoreError? {
        let next = shared.withLock { shared -> Responder? in
            guard let first = shared.waiting.first else { return nil }
            if case .single = first { shared.waiting.removeFirst() }
            return first
        }
        guard let next else { return .protocolViolation("a reply to no call") }
        switch next {
        case .single(let reply):
            reply.complete(.success(message))
        case .stream(let sink):
            // A stream's reply is read here: whether more follow decides who gets the next one.
            do {
                let wantsMore = try Replies.readStreamed(message) { view, parameters, continues in
                    if !continues { removeHead(sink) }
                    return sink.receive(view, parameters, last: !continues) || !continues
                }
                if !wantsMore {
                    isPaused = true
                    shared.withLock { shared in
                        shared.paused = true
                        updateInterest(shared)
                    }
                }
            } catch let error as UserStoreError where error.kind == .daemon {
                removeHead(sink) // the daemon's error ends the stream
                sink.fail(error)
            } catch {
                return error as? UserStoreError ?? .protocolViolation("\(error)")
            }
        }
        return nil
    }

    /// Takes the stream `sink` off the head of the queue, if it is still there: a `close` from
    /// another thread may have emptied the queue while its reply was being read.
    private func removeHead(_ sink: any StreamResponder) {
        shared.withLock { shared in
            if case .stream(let head)? = shared.waiting.first, head === sink { shared.waiting.removeFirst() }
        }
    }

    /// Releases the descriptor; calls still waiting fail with `error` (nil: closed by us, they
    /// failed already).
    private func finish(_ error: UserStoreError?) {
        guard !finished else { return }
        finished = true
        let (waiting, token, failure) = shared.withLock { shared in
            if shared.closed == nil { shared.closed = error ?? .closed("the connection closed") }
            closedFlag.store(true, ordering: .relaxed)
            shared.dropOutput()
            shared.released = true
            defer {
                shared.waiting.removeAll()
                shared.token = 0
            }
            return (shared.waiting, shared.token, shared.closed!)
        }
        if token != 0 { loop.unregister(descriptor, token: token) }
        Glibc.close(descriptor)
        for responder in waiting { responder.fail(failure) }
        onClose(self)
    }
}

/// The call never left: the connection had closed already. Safe to send again elsewhere.
struct NotSent: Error {}
