import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import UserStoreCore
import Varlink

/// The varlink socket: accepts connections and serves each on its channel's event loop with a
/// ``ConnectionHandler``. A slow, idle or broken client only ever holds up its own connection.
final class SocketServer: Service {
    private let listener: any Channel
    private let context: DaemonContext
    private let onReady: @Sendable () -> Void
    private let onStopping: @Sendable () -> Void

    private init(listener: any Channel, context: DaemonContext,
                 onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) {
        self.listener = listener
        self.context = context
        self.onReady = onReady
        self.onStopping = onStopping
    }

    /// Binds `path` (or adopts `inherited`, a listening socket from systemd).
    static func bind(path: String, inherited: Int32?, context: DaemonContext, logger: Logger,
                     onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) async throws -> SocketServer {
        let shared = ConnectionHandler.Shared(context: context, fastPath: FastPath(context: context),
                                              router: RequestRouter(context: context, logger: logger), logger: logger)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 1024)
            // A client that shuts down its sending side still gets the replies to what it sent.
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelInitializer { child in
                PeerCredentials.read(from: child).flatMapThrowing { credentials in
                    try child.pipeline.syncOperations.addHandler(ConnectionHandler(shared: shared, credentials: credentials))
                }
            }
        let listener: any Channel
        if let inherited {
            listener = try await bootstrap.withBoundSocket(inherited).get()
        } else {
            try SocketBinder.prepare(path)
            listener = try await bootstrap.bind(unixDomainSocketPath: path, cleanupExistingSocketFile: false).get()
            try SocketBinder.restrict(path, mode: context.configuration.socketMode, group: context.configuration.socketGroup)
        }
        return SocketServer(listener: listener, context: context, onReady: onReady, onStopping: onStopping)
    }

    /// Serves until graceful shutdown; then accepts nothing more, lets every connection finish
    /// the calls it started, and returns when all are closed.
    func run() async throws {
        onReady()
        try? await gracefulShutdown()
        context.beginShutdown()
        onStopping()
        try? await listener.close()
        await context.connections.quiesce()
    }
}
