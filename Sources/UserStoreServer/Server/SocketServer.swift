import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization
import UserStoreCore
import Varlink

/// The varlink socket: accepts connections and serves each in its own task, sequentially
/// (varlink replies come in request order). A slow, idle or broken client only ever holds
/// up its own connection.
final class SocketServer: Service {
    typealias Connection = NIOAsyncChannel<InboundFrame, ByteBuffer>
    typealias Listener = NIOAsyncChannel<(Connection, PeerCredentials?), Never>

    private let listener: Listener
    private let context: DaemonContext
    private let router: RequestRouter
    private let logger: Logger
    private let onReady: @Sendable () -> Void
    private let onStopping: @Sendable () -> Void

    private init(listener: Listener, context: DaemonContext, logger: Logger,
                 onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) {
        self.listener = listener
        self.context = context
        self.router = RequestRouter(context: context, logger: logger)
        self.logger = logger
        self.onReady = onReady
        self.onStopping = onStopping
    }

    /// Binds `path` (or adopts `inherited`, a listening socket from systemd).
    static func bind(path: String, inherited: Int32?, context: DaemonContext, logger: Logger,
                     onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) async throws -> SocketServer {
        let maxRequestBytes = context.configuration.limits.maxRequestBytes
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 1024)
        let initializer: @Sendable (any Channel) -> EventLoopFuture<(Connection, PeerCredentials?)> = { child in
            PeerCredentials.read(from: child).flatMapThrowing { credentials in
                try child.pipeline.syncOperations.addHandler(ByteToMessageHandler(NULFrameDecoder(maxMessageBytes: maxRequestBytes)))
                return (try Connection(wrappingChannelSynchronously: child), credentials)
            }
        }
        let listener: Listener
        if let inherited {
            listener = try await bootstrap.bind(inherited, childChannelInitializer: initializer)
        } else {
            try SocketBinder.prepare(path)
            listener = try await bootstrap.bind(unixDomainSocketPath: path, cleanupExistingSocketFile: false, childChannelInitializer: initializer)
            try SocketBinder.restrict(path, mode: context.configuration.socketMode, group: context.configuration.socketGroup)
        }
        return SocketServer(listener: listener, context: context, logger: logger, onReady: onReady, onStopping: onStopping)
    }

    func run() async throws {
        try await withGracefulShutdownHandler {
            try await listener.executeThenClose { inbound in
                onReady()
                try await withThrowingDiscardingTaskGroup { group in
                    for try await (connection, credentials) in inbound.cancelOnGracefulShutdown() {
                        group.addTask(executorPreference: EventLoopTaskExecutor(eventLoop: connection.channel.eventLoop)) {
                            await self.serve(connection, credentials: credentials)
                        }
                    }
                }
            }
        } onGracefulShutdown: {
            self.context.counters.withLock { $0.shuttingDown = true }
            self.onStopping()
        }
    }

    private func serve(_ connection: Connection, credentials: PeerCredentials?) async {
        guard let credentials else {
            try? await connection.channel.close()
            return
        }
        let (settings, admitted) = context.counters.withLock { counters in
            let settings = context.settings.withLock { $0 }
            guard counters.connections < settings.limits.maxConnections else { return (settings, false) }
            counters.connections += 1
            return (settings, true)
        }
        defer { if admitted { context.counters.withLock { $0.connections -= 1 } } }
        let peer = PeerIdentity(uid: credentials.uid, gid: credentials.gid, pid: credentials.pid,
                                grant: settings.access.grant(uid: credentials.uid, gid: credentials.gid, groups: credentials.groups))
        let parser = JSONParser(maxDepth: settings.limits.maxJSONDepth)
        let gate = ConnectionGate(channel: connection.channel)
        do {
            // Not `cancelOnGracefulShutdown()`: it iterates the stream in a task of its own on
            // the global pool, a thread hand-off per request. The gate closes an idle connection
            // at shutdown instead and lets a request in flight finish first.
            try await withGracefulShutdownHandler {
                try await connection.executeThenClose { inbound, outbound in
                    let send: ReplySink = { bytes in try await outbound.write(ByteBuffer(bytes: bytes)) }
                    guard admitted else {
                        try await send(VarlinkReply.encode(Errors.limitExceeded("connections", maximum: settings.limits.maxConnections)))
                        return
                    }
                    for try await frame in inbound {
                        guard gate.begin() else { return }
                        defer { gate.end() }
                        guard case .message(let buffer) = frame else {
                            try await send(VarlinkReply.encode(Errors.limitExceeded("requestBytes", maximum: settings.limits.maxRequestBytes)))
                            return
                        }
                        let call: VarlinkCall
                        do {
                            call = try VarlinkCall(message: try parser.parse(buffer.readableBytesView))
                        } catch let error as VarlinkError {
                            try await send(VarlinkReply.encode(error))
                            continue
                        } catch {
                            try await send(VarlinkReply.encode(VarlinkError.invalidRequest("\(error)")))
                            continue
                        }
                        try await router.handle(call, peer: peer, send: send)
                    }
                }
            } onGracefulShutdown: {
                gate.stop()
            }
        } catch {
            logger.debug("connection closed", metadata: ["error": "\(error)", "pid": "\(credentials.pid)"])
        }
    }
}

/// Ends a connection at graceful shutdown: at once when it waits for a request, after the
/// reply when a request is in flight.
final class ConnectionGate: Sendable {
    private struct State { var busy = false, stopping = false }
    private let state = Mutex(State())
    private let channel: any Channel

    init(channel: any Channel) { self.channel = channel }

    /// Before handling a request: false when the connection is to end instead.
    func begin() -> Bool {
        state.withLock { state in
            guard !state.stopping else { return false }
            state.busy = true
            return true
        }
    }

    /// After the reply: closes the connection if shutdown began meanwhile.
    func end() {
        let close = state.withLock { state in
            state.busy = false
            return state.stopping
        }
        if close { channel.close(promise: nil) }
    }

    /// Shutdown began: closes the connection unless a request is in flight.
    func stop() {
        let close = state.withLock { state in
            state.stopping = true
            return !state.busy
        }
        if close { channel.close(promise: nil) }
    }
}
