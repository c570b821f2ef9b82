import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import ServiceLifecycle
import Synchronization
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
package final class PeerListener: Service {
    private let channel: any Channel

    private init(channel: any Channel) {
        self.channel = channel
    }

    /// Connections still in their TLS handshake, at most: more are closed at once (anyone who
    /// can reach the port could otherwise hold descriptors the stores need).
    package static let maxHandshakes = 128
    /// A handshake not done within this is ended.
    package static let handshakeTimeout = TimeAmount.seconds(10)

    /// Something that serves an accepted peer's end of a socket pair as a connection of the
    /// daemon's event loops (`SocketServer.adopt`), told the peer's address.
    package typealias Adopt = @Sendable (_ descriptor: Int32, _ peerAddress: String) -> Void

    /// Listens on `listen`; each peer that passes the TLS handshake is handed to `adopt`.
    package static func bind(_ listen: HostPort, tls: PeerTLS, adopt: @escaping Adopt, logger: Logger) async throws -> PeerListener {
        let context = tls.server
        let handshaking = Handshakes()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .peerKeepalive()
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard handshaking.begin(maximum: maxHandshakes) else {
                        logger.warning("refused a connection to the cluster port: \(maxHandshakes) handshakes already under way", metadata: [
                            "event": "cluster-peer-refused", "peer": .string(channel.remoteAddress.map { "\($0)" } ?? "?"),
                        ])
                        channel.close(promise: nil)
                        return
                    }
                    let (network, local) = GlueHandler.pair()
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    try channel.pipeline.syncOperations.addHandler(PeerAdmission(adopt: adopt, local: local, handshaking: handshaking, logger: logger))
                    try channel.pipeline.syncOperations.addHandler(network)
                }
            }
            .bind(host: listen.host, port: listen.port).get()
        logger.notice("listening for other daemons on \(listen.host):\(listen.port) (mutual TLS)", metadata: ["event": "cluster-listening"])
        return PeerListener(channel: channel)
    }

    /// Until graceful shutdown; then accepts no more peers (the connections already joined end
    /// with the daemon's own, once their calls are answered).
    package func run() async throws {
        try? await gracefulShutdown()
        try? await channel.close()
    }
}

/// Once a peer's TLS handshake succeeded, joins its connection to a new connection of the
/// daemon's event loops (a socket pair: this end wrapped as a NIO channel on the same event
/// loop, the other handed to the daemon: ``PeerListener/Adopt``). A failed handshake is logged and
/// the connection closed.
private final class PeerAdmission: ChannelInboundHandler, RemovableChannelHandler {
    package typealias InboundIn = NIOAny

    private let adopt: PeerListener.Adopt
    private let local: GlueHandler
    private let handshaking: Handshakes
    private let logger: Logger
    private var timeout: Scheduled<Void>?
    private var counted = true

    package init(adopt: @escaping PeerListener.Adopt, local: GlueHandler, handshaking: Handshakes, logger: Logger) {
        self.adopt = adopt
        self.local = local
        self.handshaking = handshaking
        self.logger = logger
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel, logger = self.logger
        timeout = context.eventLoop.scheduleTask(in: PeerListener.handshakeTimeout) {
            logger.warning("refused a connection to the cluster port: no TLS handshake within \(PeerListener.handshakeTimeout.nanoseconds / 1_000_000_000) s",
                           metadata: ["event": "cluster-peer-refused", "peer": .string(channel.remoteAddress.map { "\($0)" } ?? "?")])
            channel.close(promise: nil)
        }
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        timeout?.cancel()
        if counted {
            counted = false
            handshaking.end()
        }
    }

    package func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
            join(context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    package func errorCaught(context: ChannelHandlerContext, error: any Error) {
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
        // The glue handler is the loop's own (not Sendable): handed to the initializer, which
        // runs on the same loop, through a loop-bound box.
        let network = context.channel, local = NIOLoopBound(self.local, eventLoop: context.eventLoop), adopt = self.adopt
        let served = pair[0]
        ClientBootstrap(group: context.eventLoop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(local.value) }
            }
            .withConnectedSocket(pair[1])
            .whenComplete { [logger] result in
                switch result {
                case .success:
                    // Served only once its other end is joined: a failure leaves no connection
                    // waiting for bytes that never come.
                    adopt(served, peer)
                case .failure(let error):
                    logger.error("cannot serve a peer daemon at \(peer): \(error)", metadata: ["event": "cluster-peer-refused"])
                    close(served)
                    network.close(promise: nil)
                }
            }
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }
}

/// How many peer connections are in their TLS handshake.
private final class Handshakes: Sendable {
    private let count = Mutex(0)

    /// Counts one more unless `maximum` are under way.
    package func begin(maximum: Int) -> Bool {
        count.withLock { count in
            guard count < maximum else { return false }
            count += 1
            return true
        }
    }

    package func end() { count.withLock { $0 -= 1 } }
}
