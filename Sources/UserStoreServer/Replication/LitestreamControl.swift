import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// Litestream's control socket: HTTP/1.1 with JSON bodies over a Unix socket (`socket:` in
/// Litestream's configuration; docs/notes/litestream-0.5.md lists the routes). One connection
/// per request (`Connection: close`); SwiftNIO's HTTP/1 codec reads the replies.
///
/// Every call blocks its thread until the reply (or `timeout`): call it from the blocking pool,
/// never from an event loop.
struct LitestreamControl: Sendable {
    /// The control socket's path.
    let socketPath: String

    /// A failed request: no connection, a timeout, or Litestream's error reply.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// `POST /register`: replicate the database at `path` to `replicaURL`.
    func register(_ path: String, replicaURL: String) throws {
        _ = try post("/register", ["path": path, "replica_url": replicaURL], timeout: .seconds(10))
    }

    /// `POST /unregister`: a final sync, then stop replicating `path` and close Litestream's
    /// connection to it.
    func unregister(_ path: String, timeoutSeconds: Int = 30) throws {
        _ = try post("/unregister", ["path": path, "timeout": timeoutSeconds], timeout: .seconds(Int64(timeoutSeconds + 5)))
    }

    /// `POST /sync` with `wait`: returns once every transaction committed before the call is in
    /// the replica (`replicated_txid`), or throws.
    func syncAndWait(_ path: String, timeoutSeconds: Int) throws -> SyncReply {
        SyncReply(try post("/sync", Self.syncBody(path, timeoutSeconds), timeout: .seconds(Int64(timeoutSeconds + 5))))
    }

    /// ``syncAndWait(_:timeoutSeconds:)`` without blocking a thread (durable writes wait here).
    func syncAndWait(_ path: String, timeoutSeconds: Int) async throws -> SyncReply {
        let body = try JSONSerialization.data(withJSONObject: Self.syncBody(path, timeoutSeconds))
        return SyncReply(try Self.decode("/sync", try await exchange(.POST, "/sync", body: body, timeout: .seconds(Int64(timeoutSeconds + 5))).get()))
    }

    private static func syncBody(_ path: String, _ timeoutSeconds: Int) -> [String: Any] {
        ["path": path, "wait": true, "timeout": timeoutSeconds]
    }

    /// What `/sync` answered: `synced`, `synced_local` or `no_change`, and the positions.
    struct SyncReply {
        let status: String
        let txid: Int64
        let replicatedTXID: Int64

        init(_ reply: [String: Any]) {
            status = reply["status"] as? String ?? ""
            txid = (reply["txid"] as? NSNumber)?.int64Value ?? 0
            replicatedTXID = (reply["replicated_txid"] as? NSNumber)?.int64Value ?? 0
        }
    }

    /// `GET /list`: every registered database and its state.
    func list() throws -> [ListedDatabase] {
        let reply = try request(.GET, "/list", body: nil, timeout: .seconds(5))
        return (reply["databases"] as? [[String: Any]] ?? []).map { entry in
            ListedDatabase(path: entry["path"] as? String ?? "", status: entry["status"] as? String ?? "",
                           lastSyncAt: (entry["last_sync_at"] as? String).flatMap(RFC3339.parse))
        }
    }

    /// One database in `/list`.
    struct ListedDatabase {
        let path: String
        /// `replicating`, `open` or `stopped`.
        let status: String
        let lastSyncAt: Date?
    }

    /// `GET /info`: Litestream's version and pid (throws when it does not answer).
    func info() throws -> (version: String, pid: Int) {
        Self.info(try request(.GET, "/info", body: nil, timeout: .seconds(5)))
    }

    /// ``info()`` without blocking a thread (start-up waits on it from async code).
    func info() async throws -> (version: String, pid: Int) {
        Self.info(try Self.decode("/info", try await exchange(.GET, "/info", body: nil, timeout: .seconds(5)).get()))
    }

    private static func info(_ reply: [String: Any]) -> (version: String, pid: Int) {
        (reply["version"] as? String ?? "", (reply["pid"] as? NSNumber)?.intValue ?? 0)
    }

    // MARK: HTTP

    private func post(_ route: String, _ body: [String: Any], timeout: TimeAmount) throws -> [String: Any] {
        try Self.decode(route, try exchange(.POST, route, body: try JSONSerialization.data(withJSONObject: body), timeout: timeout).wait())
    }

    private func request(_ method: HTTPMethod, _ route: String, body: Data?, timeout: TimeAmount) throws -> [String: Any] {
        try Self.decode(route, try exchange(method, route, body: body, timeout: timeout).wait())
    }


    /// The reply's JSON object, or the error Litestream named.
    private static func decode(_ route: String, _ reply: (HTTPResponseStatus, ByteBuffer)) throws -> [String: Any] {
        let (status, buffer) = reply
        let json = (try? JSONSerialization.jsonObject(with: Data(buffer.readableBytesView))) as? [String: Any]
        guard status == .ok else {
            let message = json?["error"] as? String ?? String(buffer: buffer).trimmingCharacters(in: .whitespacesAndNewlines)
            throw Failure(description: "Litestream \(route): \(status.code) \(message)")
        }
        guard let json else { throw Failure(description: "Litestream \(route): the reply is not a JSON object") }
        return json
    }

    /// One request on a connection of its own: the reply's status and body, or a failure after
    /// `timeout`.
    private func exchange(_ method: HTTPMethod, _ route: String, body: Data?, timeout: TimeAmount) -> EventLoopFuture<(HTTPResponseStatus, ByteBuffer)> {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let promise = loop.makePromise(of: (HTTPResponseStatus, ByteBuffer).self)
        let socketPath = self.socketPath
        let deadline = loop.scheduleTask(in: timeout) {
            promise.fail(Failure(description: "Litestream did not answer \(route) within \(timeout.nanoseconds / 1_000_000_000) s"))
        }
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: route)
        head.headers.add(name: "Host", value: "litestream")
        head.headers.add(name: "Connection", value: "close")
        if let body {
            head.headers.add(name: "Content-Type", value: "application/json")
            head.headers.add(name: "Content-Length", value: "\(body.count)")
        }
        let request = head
        ClientBootstrap(group: loop)
            .connectTimeout(.seconds(2))
            .channelInitializer { channel in
                channel.pipeline.addHTTPClientHandlers().flatMapThrowing {
                    try channel.pipeline.syncOperations.addHandler(ReplyCollector(promise: promise))
                }
            }
            .connect(unixDomainSocketPath: socketPath)
            .whenComplete { result in
                switch result {
                case .failure(let error):
                    promise.fail(Failure(description: "cannot connect to Litestream's control socket \(socketPath): \(error)"))
                case .success(let channel):
                    channel.write(HTTPClientRequestPart.head(request), promise: nil)
                    if let body { channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: body))), promise: nil) }
                    channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
                    promise.futureResult.whenComplete { _ in channel.close(promise: nil) }
                }
            }
        promise.futureResult.whenComplete { _ in deadline.cancel() }
        return promise.futureResult
    }

    /// Gathers one response and fulfils the promise with its status and body.
    private final class ReplyCollector: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPClientResponsePart
        private let promise: EventLoopPromise<(HTTPResponseStatus, ByteBuffer)>
        private var status: HTTPResponseStatus = .ok
        private var body = ByteBuffer()

        init(promise: EventLoopPromise<(HTTPResponseStatus, ByteBuffer)>) {
            self.promise = promise
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head): status = head.status
            case .body(var part): body.writeBuffer(&part)
            case .end: promise.succeed((status, body))
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.fail(error)
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            promise.fail(Failure(description: "Litestream closed the connection before replying"))
        }
    }
}
