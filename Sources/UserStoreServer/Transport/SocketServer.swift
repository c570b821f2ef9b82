import CUnixSocket
import Logging
import ServiceLifecycle
import Synchronization
import UserStoreCore
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// The varlink socket: one ``EventLoop`` per core accepts connections and serves each with a
/// ``Connection``. A slow, idle or broken client only ever holds up its own connection.
final class SocketServer: Service {
    private let listener: Int32
    private let loops: [EventLoop]
    private let shared: Session.Shared
    /// Which loop serves the next connection.
    private let spread: LoopSpread
    private let acceptors: [Acceptor]
    private let context: DaemonContext
    private let onReady: @Sendable () -> Void
    private let onStopping: @Sendable () -> Void

    private init(listener: Int32, loops: [EventLoop], spread: LoopSpread, acceptors: [Acceptor], shared: Session.Shared, context: DaemonContext,
                 onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) {
        self.listener = listener
        self.spread = spread
        self.shared = shared
        self.loops = loops
        self.acceptors = acceptors
        self.context = context
        self.onReady = onReady
        self.onStopping = onStopping
    }

    /// Binds `path` (or adopts `inherited`, a listening socket from systemd) and starts the loops.
    static func bind(path: String, inherited: Int32?, context: DaemonContext, logger: Logger,
                     onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) async throws -> SocketServer {
        let listener: Int32
        if let inherited {
            listener = inherited
            _ = fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK)
            _ = fcntl(listener, F_SETFD, FD_CLOEXEC)
        } else {
            try SocketBinder.prepare(path)
            listener = try listen(on: path)
            try SocketBinder.restrict(path, mode: context.configuration.socketMode, group: context.configuration.socketGroup)
        }
        let shared = Session.Shared(context: context, fastPath: FastPath(context: context),
                                       router: RequestRouter(context: context, logger: logger), logger: logger,
                                       forwarder: context.cluster?.forwarder)
        let loops = try (0..<max(1, System.coreCount)).map { try EventLoop(name: "userstored-loop-\($0)") }
        let spread = LoopSpread(loops)
        let acceptors = loops.map { Acceptor(listener: listener, loop: $0, spread: spread, shared: shared) }
        for (loop, acceptor) in zip(loops, acceptors) {
            loop.start()
            loop.execute {
                acceptor.start()
                sweep(loop)
            }
        }
        return SocketServer(listener: listener, loops: loops, spread: spread, acceptors: acceptors, shared: shared, context: context, onReady: onReady, onStopping: onStopping)
    }

    /// Serves `descriptor`, a connected socket that did not come through the listener (a peer
    /// daemon's connection, joined through a socket pair), as `peer`, on the next loop; nil:
    /// as whoever `SO_PEERCRED` names, like an accepted connection (a socket pair's creator).
    func adopt(_ descriptor: Int32, peer: PeerIdentity?) {
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        spread.serve(descriptor, shared: shared, peer: peer)
    }

    /// How many connections each loop serves now, loop by loop.
    func connectionsPerLoop() async -> [Int] {
        await eachConnection { _ in 1 }
    }

    /// The reply bytes each loop holds for its clients (ready, unsent, or waiting in order).
    func heldReplyBytesPerLoop() async -> [Int] {
        await eachConnection { $0.replies.heldBytes }
    }

    /// The sum of `measure` over each loop's connections, loop by loop (read on each loop).
    private func eachConnection(_ measure: @escaping @Sendable (Connection) -> Int) async -> [Int] {
        var sums: [Int] = []
        for loop in loops {
            sums.append(await withCheckedContinuation { done in
                loop.execute {
                    var sum = 0
                    loop.forEachHandler { if let connection = $0 as? Connection { sum += measure(connection) } }
                    done.resume(returning: sum)
                }
            })
        }
        return sums
    }

    /// A non-blocking listening Unix socket bound to `path`.
    private static func listen(on path: String) throws -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw TransportError.system("socket", errno) }
        let bound = UnixSocketAddress.with(path: path) { address, length in Glibc.bind(descriptor, address, length) }
        guard bound == 0 else {
            let code = errno
            close(descriptor)
            throw SocketBinder.PathError(path: path, problem: bound == nil ? "the path is longer than a socket address allows (107 bytes)"
                                                                            : "bind failed: \(String(cString: strerror(code)))")
        }
        guard Glibc.listen(descriptor, 1024) == 0 else {
            let code = errno
            close(descriptor)
            throw TransportError.system("listen", code)
        }
        return descriptor
    }

    /// Serves until graceful shutdown; then accepts nothing more, lets every connection finish
    /// the calls it started, and returns when all are closed.
    func run() async throws {
        onReady()
        try? await gracefulShutdown()
        await drain()
    }

    /// Graceful shutdown: new calls get `ShuttingDown`, nothing more is accepted, and every
    /// connection finishes the calls it started; returns when all are closed and the loops stopped.
    func drain() async {
        context.beginShutdown()
        onStopping()
        await withTaskGroup(of: Void.self) { group in
            for (loop, acceptor) in zip(loops, acceptors) {
                group.addTask { await withCheckedContinuation { done in loop.execute { acceptor.finish(); done.resume() } } }
            }
        }
        close(listener)
        await context.connections.quiesce()
        for loop in loops { loop.stopAndWait() }
    }
}

/// Spreads connections over the loops in turn, whichever loop accepted them: `EPOLLEXCLUSIVE`
/// wakes whichever loop waits, and a burst of connections could otherwise all land on one loop
/// while the others idle.
final class LoopSpread: Sendable {
    let loops: [EventLoop]
    private let next = Atomic<Int>(0)

    init(_ loops: [EventLoop]) {
        self.loops = loops
    }

    /// Serves `descriptor` (a connected socket) on the next loop in turn; `peer`: as another
    /// daemon's connection (see ``Connection/start(_:loop:shared:peer:)``).
    func serve(_ descriptor: Int32, shared: Session.Shared, peer: PeerIdentity? = nil) {
        let loop = loops[next.add(1, ordering: .relaxed).oldValue % loops.count]
        if loop.inEventLoop {
            Connection.start(descriptor, loop: loop, shared: shared, peer: peer)
        } else {
            loop.execute { Connection.start(descriptor, loop: loop, shared: shared, peer: peer) }
        }
    }
}

/// Every second, asks each connection of `loop` whether it stalled (``Connection/sweep(now:)``):
/// one pass over the loop's connections instead of a timer per connection per request.
private func sweep(_ loop: EventLoop) {
    let now = StoreClock.now()
    loop.forEachHandler { handler in (handler as? Connection)?.sweep(now: now) }
    loop.schedule(after: 1_000_000_000) { sweep(loop) }
}

enum System {
    /// Cores this process may run on.
    static var coreCount: Int { Int(us_cpu_count()) }
}
