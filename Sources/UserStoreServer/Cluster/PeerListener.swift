import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import ServiceLifecycle
import UserStoreConfiguration
#if canImport(Glibc)
import Glibc
#endif

/// Where other daemons send the calls they forward (`cluster.listen`, docs/cluster.md): TCP
/// with mutual TLS — a peer without a certificate the cluster's CA signed is refused in the
/// handshake (journal `cluster-peer-refused`).
///
/// Each accepted peer is joined, through a socket pair, to a connection of the daemon's own
/// event loops, so a forwarded call is served exactly as a local one is (pipelining,
/// interactive transactions, streamed replies, limits, order), except that it is never
/// forwarded again and may use only `io.userstore.Store`.
final class PeerListener: Service {
    private let channel: any Channel

    private init(channel: any Channel) {
        self.channel = channel
    }

    static func bind(_ listen: HostPort, tls: PeerTLS, server: SocketServer, logger: Logger) async throws -> PeerListener {
        let context = tls.server
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let (network, local) = GlueHandler.pair()
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    try channel.pipeline.syncOperations.addHandler(PeerAdmission(server: server, local: local, logger: logger))
                    try channel.pipeline.syncOperations.addHandler(network)
                }
            }
            .bind(host: listen.host, port: listen.port).get()
        logger.notice("listening for other daemons on \(listen.host):\(listen.port) (mutual TLS)", metadata: ["event": "cluster-listening"])
        return PeerListener(channel: channel)
    }

    /// Until graceful shutdown; then accepts no more peers (the connections already joined end
    /// with the daemon's own, once their calls are answered).
    func run() async throws {
        try? await gracefulShutdown()
        try? await channel.close()
    }
}

/// Once a peer's TLS handshake succeeded, joins its connection to a new connection of the
/// daemon's event loops (a socket pair: this end wrapped as a NIO channel on the same event
/// loop, the other served by ``SocketServer/adopt(_:peer:)``). A failed handshake is logged and
/// the connection closed.
private final class PeerAdmission: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    private let server: SocketServer
    private let local: GlueHandler
    private let logger: Logger

    init(server: SocketServer, local: GlueHandler, logger: Logger) {
        self.server = server
        self.local = local
        self.logger = logger
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
            join(context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let peer = context.channel.remoteAddress.map { "\($0)" } ?? "?"
        if error is NIOSSLError || error is BoringSSLError {
            logger.warning("refused a peer daemon at \(peer): \(error)", metadata: ["event": "cluster-peer-refused", "peer": .string(peer), "error": .string("\(error)")])
        }
        context.close(promise: nil)
    }

    private func join(_ context: ChannelHandlerContext) {
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            logger.error("cannot serve a peer daemon: socketpair: \(String(cString: strerror(errno)))", metadata: ["event": "cluster-peer-refused"])
            context.close(promise: nil)
            return
        }
        let peer = context.channel.remoteAddress?.ipAddress ?? "peer"
        let network = context.channel, local = self.local
        server.adopt(pair[0], peer: PeerIdentity.forwarded(from: peer))
        ClientBootstrap(group: context.eventLoop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(local) }
            }
            .withConnectedSocket(pair[1])
            .whenFailure { [logger] error in
                logger.error("cannot serve a peer daemon at \(peer): \(error)", metadata: ["event": "cluster-peer-refused"])
                network.close(promise: nil)
            }
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }
}
