import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import UserStoreConfiguration

/// `GET /metrics` over HTTP/1.1 in the Prometheus text format, on `metrics.listen`: a TCP
/// address (`127.0.0.1:9464`) or a Unix socket (`unix:/run/userstore/metrics.sock`).
///
/// SwiftNIO's HTTP/1 codec parses the requests (the varlink socket needs its own loops for
/// descriptor passing; this one does not, and a well-kept HTTP parser is worth more than a
/// hand-written one facing whatever reaches the port).
final class MetricsServer: Service {
    private let channel: any Channel

    private init(channel: any Channel) {
        self.channel = channel
    }

    static func bind(_ address: MetricsAddress, context: DaemonContext, logger: Logger) async throws -> MetricsServer {
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 64)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.pipeline.configureHTTPServerPipeline(withErrorHandling: true).flatMapThrowing {
                    try channel.pipeline.syncOperations.addHandler(MetricsHandler(context: context))
                }
            }
        let channel: any Channel
        switch address {
        case .tcp(let host, let port):
            channel = try await bootstrap.bind(host: host, port: port).get()
        case .unix(let path):
            try SocketBinder.prepare(path)
            channel = try await bootstrap.bind(unixDomainSocketPath: path).get()
            try SocketBinder.restrict(path, mode: context.configuration.socketMode, group: context.configuration.socketGroup)
        }
        logger.info("metrics served on \(address)", metadata: ["event": "metrics-listening"])
        return MetricsServer(channel: channel)
    }

    func run() async throws {
        try? await gracefulShutdown()
        try? await channel.close()
    }
}

/// Answers `GET /metrics` (and `HEAD`); 404 for other paths, 405 for other methods.
private final class MetricsHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let context: DaemonContext
    private var request: HTTPRequestHead?

    init(context: DaemonContext) {
        self.context = context
    }

    func channelRead(context channelContext: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): request = head
        case .body: break
        case .end:
            guard let head = request else { return }
            request = nil
            respond(channelContext, head)
        }
    }

    /// `GET` or `HEAD` of `/metrics` (a query string aside): the exposition.
    private static func isScrape(_ head: HTTPRequestHead) -> Bool {
        (head.method == .GET || head.method == .HEAD) && head.uri.split(separator: "?", maxSplits: 1).first == "/metrics"
    }

    private func respond(_ channelContext: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let status: HTTPResponseStatus
        var body: [UInt8]
        var headers = HTTPHeaders()
        if head.method != .GET && head.method != .HEAD {
            (status, body) = (.methodNotAllowed, Array("only GET\n".utf8))
            headers.add(name: "Allow", value: "GET, HEAD")
        } else if Self.isScrape(head) {
            (status, body) = (.ok, self.context.metrics?.scrape(context: self.context) ?? [])
            headers.add(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
        } else {
            (status, body) = (.notFound, Array("try /metrics\n".utf8))
        }
        headers.add(name: "Content-Length", value: "\(body.count)")
        if !head.isKeepAlive { headers.add(name: "Connection", value: "close") }
        if head.method == .HEAD { body = [] }
        channelContext.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
        if !body.isEmpty { channelContext.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil) }
        let keepAlive = head.isKeepAlive, channel = channelContext.channel
        channelContext.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(promise: nil) }
        }
    }
}
