import CUnixSocket
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import Varlink
#if canImport(Glibc)
import Glibc
#endif

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
    ///
    /// Replies are read by threads the process's clients share (`userstore-client`, see
    /// ``executor``); calls are written by the calling task itself, so a call costs no thread
    /// hand-off on its way out.
    public init(configuration: Configuration,
                logger: Logger = Logger(label: "io.userstore.client", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.configuration = configuration
        self.logger = logger
        pool = ConnectionPool(
            configuration: .init(socketPath: configuration.socketPath, size: configuration.connections,
                                 minimumReconnectDelay: .init(configuration.minimumReconnectDelay),
                                 maximumReconnectDelay: .init(configuration.maximumReconnectDelay),
                                 maxMessageBytes: configuration.maxMessageBytes),
            logger: logger)
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

    /// Opens a connection now, if none is open: the pool otherwise connects on the first call.
    /// For learning at startup whether the daemon is reachable.
    ///
    /// - Throws: ``UserStoreError/Kind/connectionFailed`` (its ``UserStoreError/systemError``
    ///   says why), or ``UserStoreError/Kind/clientShutDown``.
    public func connect() async throws {
        let lease = try await pool.acquire(exclusive: false)
        pool.release(lease)
    }

    /// Connections open right now.
    public var openConnections: Int { pool.openConnections }

    // MARK: Calls

    /// Sends `message` on a shared connection and returns the reply's bytes.
    /// `readOnly`: the call cannot write, so it is sent again (once) if its connection broke.
    /// `descriptors` go with it (see ``ClientConnection/send(_:descriptors:to:)``).
    func call(_ message: [UInt8], readOnly: Bool = false, passing descriptors: [Int32] = []) async throws -> [UInt8] {
        var attempt = 0
        while true {
            attempt += 1
            let lease = try await pool.acquire(exclusive: false)
            do {
                let reply = try await send(message, passing: descriptors, on: lease, cancellable: true)
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

    /// Sends `message` on `lease`'s connection and waits for the reply's bytes. `cancellable`: a
    /// cancelled task stops waiting (the call may still run); otherwise the reply is awaited
    /// whatever happens (Commit and Rollback must learn their outcome).
    func send(_ message: [UInt8], passing descriptors: [Int32] = [], on lease: ConnectionPool.Lease, cancellable: Bool) async throws -> [UInt8] {
        if cancellable { try Task.checkCancellation() }
        let reply = PendingReply()
        try lease.connection.send(message, descriptors: descriptors, to: .single(reply))
        return try await reply.value(cancellable: cancellable)
    }

    /// Sends a call of `method` with string `fields` on `lease` and returns its parameters (for
    /// the calls outside the statement path: Open, Begin, Commit, Rollback).
    func send(_ method: String, _ fields: KeyValuePairs<StaticString, String>, on lease: ConnectionPool.Lease,
              cancellable: Bool) async throws -> [String: JSONValue] {
        var message = CallMessage(method: method)
        for (name, value) in fields { message.field(name, value) }
        return try Replies.parameters(try await send(message.finish(), on: lease, cancellable: cancellable))
    }

    /// The error a caller sees (``NotSent`` is internal).
    static func `public`(_ error: any Error) -> any Error {
        if error is NotSent { return UserStoreError.closed("the connection closed before the call was sent") }
        return error
    }
}

/// The loops that read every client's replies in this process, started on first use: one per
/// two cores (at most four), or `USERSTORE_CLIENT_THREADS` (1 to 16). A pool spreads its
/// connections over them; a task on ``UserStoreClient/executor`` resumes on the loop that read
/// its reply.
///
/// Why not one per core: on 2 cores, where the daemon runs too, a second loop raised the
/// client's CPU per call from 12 to 17-19 µs (more threads to switch between) and gave no
/// throughput (docs/performance.md).
enum ClientLoop {
    private static let loops = Result<[Varlink.EventLoop], any Error> {
        let count = threads(environment: ProcessInfo.processInfo.environment, cores: Int(us_cpu_count()))
        return try (0..<count).map { index in
            let loop = try Varlink.EventLoop(name: count == 1 ? "userstore-client" : "userstore-client-\(index)")
            loop.start()
            return loop
        }
    }

    /// How many loops: `USERSTORE_CLIENT_THREADS` when it is a number from 1 to 16, else one per
    /// two cores, from one to four.
    static func threads(environment: [String: String], cores: Int) -> Int {
        if let configured = environment["USERSTORE_CLIENT_THREADS"].flatMap(Int.init), (1...16).contains(configured) { return configured }
        return min(4, max(1, cores / 2))
    }

    /// Every loop.
    static func all() throws -> [Varlink.EventLoop] {
        do {
            return try loops.get()
        } catch {
            throw UserStoreError.connectFailed("cannot start the client's event loop: \(error)")
        }
    }

    /// The loop for a new connection: round the loops, across every pool of the process (so
    /// that many small pools do not all land on the first).
    static func next() throws -> Varlink.EventLoop {
        turn(of: try all())
    }

    /// The next of `loops` in turn (new connections, and jobs from outside the loops).
    static func turn(of loops: [Varlink.EventLoop]) -> Varlink.EventLoop {
        loops[Int(UInt(bitPattern: turns.add(1, ordering: .relaxed).newValue) % UInt(loops.count))]
    }

    private static let turns = Atomic<Int>(0)
}

/// Runs tasks on the client's loops, the threads that read the daemon's replies: a call made
/// there is written and its reply handed back without waking any other thread.
final class ClientLoopExecutor: TaskExecutor {
    /// The one instance: a task executor is compared by identity, so every
    /// `client.executor` must be the same object.
    static let shared = ClientLoopExecutor()

    /// Empty when the loops could not start (then jobs run on the global executor, and calls
    /// fail with the reason when they connect).
    let loops: [Varlink.EventLoop]

    private init() {
        loops = (try? ClientLoop.all()) ?? []
    }

    func enqueue(_ job: consuming ExecutorJob) {
        guard !loops.isEmpty else { return globalConcurrentExecutor.enqueue(job) }
        let job = UnownedJob(job)
        // A job enqueued on a loop (a task resumed by the reply that loop read) stays there;
        // others go round the loops.
        let loop = loops.first(where: \.inEventLoop) ?? ClientLoop.turn(of: loops)
        loop.executeSoon { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

extension UserStoreClient {
    /// The executor of the threads that read the daemon's replies for every client in this
    /// process (one per two cores, at most four; `USERSTORE_CLIENT_THREADS` overrides it).
    ///
    /// By default the reply to a call wakes the waiting task on Swift's global executor, which
    /// is another thread. Tasks that make many small calls can run on this executor instead,
    /// with `withTaskExecutorPreference(client.executor) { … }` or
    /// `group.addTask(executorPreference: client.executor)`. Then writing a call and getting its
    /// reply wake no other thread: a task resumes on the thread that read its reply. On 2 cores
    /// this cut the client's CPU per call by a third to a half (see docs/performance.md).
    ///
    /// Keep heavy computation off it. Everything on it shares its thread with the reading of
    /// replies.
    public var executor: any TaskExecutor { ClientLoopExecutor.shared }
}

extension UserStoreClient {
    // MARK: Any method

    /// Calls any method of the daemon's interfaces (io.userstore.Store, io.userstore.Admin) by
    /// name and returns its reply's parameters: for tools and the calls the typed API does not
    /// cover (`userstorectl` is built on it).
    ///
    /// ```swift
    /// import Varlink // JSONValue
    /// let status = try await client.call("io.userstore.Admin.Status")
    /// let open = status["openStores"]?.integerValue
    /// ```
    ///
    /// The call is sent once: it is never retried after it left (it may have written).
    ///
    /// - Parameter descriptors: open file descriptors passed with the call (`SCM_RIGHTS`), as
    ///   `io.userstore.Admin.ImportStore` takes its file. They stay yours: close them after the
    ///   call returns.
    /// - Throws: ``UserStoreError``: the daemon's error (``UserStoreError/Kind/daemon``) or the
    ///   transport's.
    public func call(_ method: String, _ parameters: [String: JSONValue] = [:], passing descriptors: [Int32] = []) async throws -> [String: JSONValue] {
        // Checked here, so that a bad argument fails this call alone rather than the shared
        // connection it would be written on (the daemon takes at most 16 per call).
        guard descriptors.count <= 16 else {
            throw UserStoreError.invalidArgument("\(descriptors.count) descriptors to pass; a call takes at most 16")
        }
        if let closed = descriptors.first(where: { fcntl($0, F_GETFD) < 0 }) {
            throw UserStoreError.invalidArgument("descriptor \(closed) to pass is not open")
        }
        return try Replies.parameters(try await call(Self.message(VarlinkCall(method: method, parameters: parameters)), passing: descriptors))
    }

    /// Calls any method with `more` and returns its replies' parameters as they come (the
    /// last one included): the fleet's `Migrate`/`Verify` progress, `ListStores`,
    /// `ExportStore`, ... Backpressure and ending early work as for ``UserStore/stream(_:_:)``.
    public func stream(_ method: String, _ parameters: [String: JSONValue] = [:]) async throws -> ReplySequence {
        let message = Self.message(VarlinkCall(method: method, parameters: parameters, more: true))
        return ReplySequence(producer: try await stream(message, as: ReplyStreamDecoder.self))
    }

    /// `call` on the wire, NUL included (the typed calls write theirs with ``CallMessage``).
    private static func message(_ call: VarlinkCall) -> [UInt8] {
        var writer = JSONWriter()
        writer.write(call.message)
        writer.raw(byte: 0)
        return writer.bytes
    }
}
