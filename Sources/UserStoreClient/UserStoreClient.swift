import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization
import Varlink

/// A client of `userstored`: a pool of connections to its Unix socket, shared by every task
/// of the application.
///
/// ```swift
/// try await UserStoreClient.withClient(socketPath: "/run/userstore/userstore.sock") { client in
///     let alice = client.store(for: "alice")
///     try await alice.execute("INSERT INTO notes(body) VALUES (?)", "hello")
/// }
/// ```
///
/// An application with a `ServiceGroup` adds the client to it instead: ``run()`` keeps it
/// until graceful shutdown, then closes its connections.
///
/// Concurrent calls pipeline on the pool's connections (``Configuration/connections``, 8 by
/// default). A broken connection is replaced by the next call; after a failed connect the pool
/// backs off (see ``Configuration/minimumReconnectDelay``) and calls fail fast with
/// ``UserStoreError/Kind/connectionFailed`` until a connect works again. The client retries a
/// call only when it was never sent, or when it cannot have written (`Open`); an `Execute`,
/// `Batch` or `Commit` whose connection broke fails with ``UserStoreError/Kind/connectionClosed``,
/// because it may have run.
public final class UserStoreClient: Service, Sendable {
    /// How the client connects.
    public struct Configuration: Sendable {
        /// The daemon's socket (`socketPath` in userstored.yaml).
        public var socketPath: String
        /// The most connections the pool opens (it opens them as load needs them).
        public var connections: Int = 8
        /// The first wait after a failed connect; it doubles with each failure in a row.
        public var minimumReconnectDelay: Duration = .milliseconds(50)
        /// The longest wait between connects.
        public var maximumReconnectDelay: Duration = .seconds(2)
        /// The longest reply accepted (the daemon's `limits.maxResponseBytes` plus framing).
        public var maxMessageBytes: Int = 64 << 20
        /// Rows a streamed query buffers before the client stops reading (then the daemon stops
        /// stepping the statement); reading resumes below a quarter of it.
        public var streamBufferRows: Int = 4096

        /// The defaults, for the daemon at `socketPath`.
        public init(socketPath: String) {
            self.socketPath = socketPath
        }
    }

    /// How this client connects.
    public let configuration: Configuration
    let pool: ConnectionPool
    let logger: Logger

    /// A client of the daemon at `configuration.socketPath`. It connects on the first call.
    ///
    /// - Parameter logger: where the pool logs connects, failed connects (warning) and dropped
    ///   connections (debug); by default nowhere, as a library should.
    public init(configuration: Configuration, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "io.userstore.client", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.configuration = configuration
        self.logger = logger
        pool = ConnectionPool(
            configuration: .init(socketPath: configuration.socketPath, size: configuration.connections,
                                 minimumReconnectDelay: .init(configuration.minimumReconnectDelay),
                                 maximumReconnectDelay: .init(configuration.maximumReconnectDelay),
                                 maxMessageBytes: configuration.maxMessageBytes),
            group: eventLoopGroup, logger: logger)
    }

    /// A client of the daemon at `socketPath` with the default configuration.
    public convenience init(socketPath: String) {
        self.init(configuration: Configuration(socketPath: socketPath))
    }

    /// Runs `body` with a client, and shuts the client down when it returns or throws.
    public static func withClient<Result>(
        socketPath: String,
        configuration: ((inout Configuration) -> Void)? = nil,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (UserStoreClient) async throws -> sending Result
    ) async throws -> sending Result {
        var settings = Configuration(socketPath: socketPath)
        configuration?(&settings)
        let client = UserStoreClient(configuration: settings)
        do {
            let result = try await body(client)
            await client.shutdown()
            return result
        } catch {
            await client.shutdown()
            throw error
        }
    }

    /// The store of `user` (no call is made until you use it).
    public func store(for user: String) -> UserStore {
        UserStore(client: self, user: user)
    }

    /// `Service`: keeps the client until the service group's graceful shutdown (or
    /// cancellation), then closes its connections.
    public func run() async throws {
        try? await gracefulShutdown()
        await shutdown()
    }

    /// Closes the pool's connections. Calls in flight fail with
    /// ``UserStoreError/Kind/connectionClosed``, later ones with ``UserStoreError/Kind/clientShutDown``.
    public func shutdown() async {
        await pool.shutdown()
    }

    /// Connections open right now.
    public var openConnections: Int { pool.openConnections }

    // MARK: Calls

    /// Calls `method` with `parameters` on a shared connection and returns the reply's parameters.
    /// `readOnly`: the call cannot write, so it is sent again (once) if its connection broke.
    func call(_ method: String, _ parameters: [String: JSONValue], readOnly: Bool = false) async throws -> [String: JSONValue] {
        var attempt = 0
        while true {
            attempt += 1
            let lease = try await pool.acquire(exclusive: false)
            do {
                let reply = try await send(method, parameters, on: lease, cancellable: true)
                pool.release(lease)
                return reply
            } catch {
                pool.release(lease)
                // Never sent: safe to send again, on another connection (a few times: several
                // connections may have closed at once). Sent and cut off: only if it cannot write.
                if error is NotSent, attempt < 4 { continue }
                if readOnly, attempt == 1, (error as? UserStoreError)?.kind == .connectionClosed { continue }
                throw Self.public(error)
            }
        }
    }

    /// Sends one call on `lease`'s connection and waits for its reply. `cancellable`: a
    /// cancelled task stops waiting (the call may still run); otherwise the reply is awaited
    /// whatever happens (Commit and Rollback must learn their outcome).
    func send(_ method: String, _ parameters: [String: JSONValue], on lease: ConnectionPool.Lease,
              cancellable: Bool) async throws -> [String: JSONValue] {
        if cancellable { try Task.checkCancellation() }
        let channel = lease.channel
        let promise = channel.eventLoop.makePromise(of: [String: JSONValue].self)
        let written = channel.eventLoop.makePromise(of: Void.self)
        // A write that fails never reached the handler, or the handler failed the call already
        // (the first outcome wins): either way the call was not sent whole, so it did not run.
        written.futureResult.whenFailure { _ in promise.fail(NotSent()) }
        channel.writeAndFlush(OutgoingCall(message: Self.encode(method, parameters, more: false, allocator: channel.allocator),
                                           responder: .single(promise)), promise: written)
        return cancellable ? try await Self.cancellableGet(promise.futureResult) : try await promise.futureResult.get()
    }

    /// The call's message (``VarlinkCall/message``) and its NUL.
    static func encode(_ method: String, _ parameters: [String: JSONValue], more: Bool, allocator: ByteBufferAllocator) -> ByteBuffer {
        var writer = JSONWriter(capacity: 256)
        writer.write(VarlinkCall(method: method, parameters: parameters, more: more).message)
        writer.raw(byte: 0)
        var buffer = allocator.buffer(capacity: writer.bytes.count)
        buffer.writeBytes(writer.bytes)
        return buffer
    }

    /// `future`'s value, or `CancellationError` as soon as the task is cancelled.
    static func cancellableGet<T: Sendable>(_ future: EventLoopFuture<T>) async throws -> T {
        // Whoever comes first — the result or the cancellation — takes the continuation.
        let state = Mutex<(continuation: CheckedContinuation<T, any Error>?, cancelled: Bool)>((nil, false))
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let cancelled = state.withLock { state -> Bool in
                    if !state.cancelled { state.continuation = continuation }
                    return state.cancelled
                }
                if cancelled { return continuation.resume(throwing: CancellationError()) }
                future.whenComplete { result in state.withLock { $0.continuation.take() }?.resume(with: result) }
            }
        } onCancel: {
            state.withLock { state in
                state.cancelled = true
                return state.continuation.take()
            }?.resume(throwing: CancellationError())
        }
    }

    /// The error a caller sees (``NotSent`` is internal).
    static func `public`(_ error: any Error) -> any Error {
        if error is NotSent { return UserStoreError.closed("the connection closed before the call was sent") }
        return error
    }
}
