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
        /// Whether the request may have reached Litestream (false: the connection itself failed,
        /// so no Litestream acted on it).
        var delivered = true
    }

    /// `POST /register`: replicate the database at `path` to `replicaURL` (blocking).
    func register(_ path: String, replicaURL: String) throws {
        _ = try call(.POST, "/register", ["path": path, "replica_url": replicaURL], timeout: .seconds(10))
    }

    /// ``register(_:replicaURL:)`` without blocking a thread.
    func register(_ path: String, replicaURL: String) async throws {
        _ = try await call(.POST, "/register", ["path": path, "replica_url": replicaURL], timeout: .seconds(10))
    }

    /// `POST /unregister`: a final sync, then stop replicating `path` and close Litestream's
    /// connection to it; answered by `until` at the latest (blocking).
    func unregister(_ path: String, until deadline: ContinuousClock.Instant) throws {
        _ = try call(.POST, "/unregister", ["path": path, "timeout": Self.seconds(until: deadline)], timeout: Self.left(until: deadline))
    }

    /// ``unregister(_:until:)`` without blocking a thread.
    func unregister(_ path: String, until deadline: ContinuousClock.Instant) async throws {
        _ = try await call(.POST, "/unregister", ["path": path, "timeout": Self.seconds(until: deadline)], timeout: Self.left(until: deadline))
    }

    /// `POST /sync` with `wait`: returns once every transaction committed before the call is in
    /// the replica (`replicated_txid`), or throws — by `until` at the latest (blocking).
    func syncAndWait(_ path: String, until deadline: ContinuousClock.Instant) throws -> SyncReply {
        SyncReply(try call(.POST, "/sync", Self.syncBody(path, deadline), timeout: Self.left(until: deadline)))
    }

    /// ``syncAndWait(_:until:)`` without blocking a thread (durable writes wait here).
    func syncAndWait(_ path: String, until deadline: ContinuousClock.Instant) async throws -> SyncReply {
        SyncReply(try await call(.POST, "/sync", Self.syncBody(path, deadline), timeout: Self.left(until: deadline)))
    }

    private static func syncBody(_ path: String, _ deadline: ContinuousClock.Instant) -> [String: Any] {
        ["path": path, "wait": true, "timeout": seconds(until: deadline)]
    }

    /// The time left until `deadline` (at least a millisecond): how long the daemon waits for a reply.
    private static func left(until deadline: ContinuousClock.Instant) -> TimeAmount {
        let left = deadline - .now
        let nanoseconds = left.components.seconds * 1_000_000_000 + left.components.attoseconds / 1_000_000_000
        return .nanoseconds(max(1_000_000, nanoseconds))
    }

    /// Litestream's own time-out for a request, in the whole seconds it takes, rounded up: it
    /// gives up no earlier than the daemon, which stops waiting at the deadline itself.
    private static func seconds(until deadline: ContinuousClock.Instant) -> Int {
        let left = deadline - .now
        return max(1, Int(left.components.seconds) + (left.components.attoseconds > 0 ? 1 : 0))
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

        /// Whether the replica holds everything the sync covered (`no_change` too: with `wait`,
        /// Litestream ships to the replica even when its local position did not move).
        var isReplicated: Bool { ["no_change", "synced"].contains(status) && replicatedTXID >= txid }
    }

    /// `GET /list`: every registered database and its state.
    func list() async throws -> [ListedDatabase] {
        let reply = try await call(.GET, "/list", nil, timeout: .seconds(5))
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

    /// Which Litestream answers: its pid and when it started (`GET /info`).
    struct Instance: Equatable {
        let pid: Int32
        let startedAt: String
        let version: String
    }

    /// `GET /info`: which Litestream answers (throws when none does within 5 s).
    func info() async throws -> Instance {
        let reply = try await call(.GET, "/info", nil, timeout: .seconds(5))
        return Instance(pid: (reply["pid"] as? NSNumber)?.int32Value ?? 0, startedAt: reply["started_at"] as? String ?? "",
                        version: reply["version"] as? String ?? "")
    }

    // MARK: HTTP

    /// One request, blocking its thread until the reply: its JSON object, or the error.
    private func call(_ method: HTTPMethod, _ route: String, _ body: [String: Any]?, timeout: TimeAmount) throws -> [String: Any] {
        let data = try body.map { try JSONSerialization.data(withJSONObject: $0) }
        return try Self.decode(route, try exchange(method, route, body: data, timeout: timeout).wait())
    }

    /// ``call(_:_:_:timeout:)`` without blocking a thread.
    private func call(_ method: HTTPMethod, _ route: String, _ body: [String: Any]?, timeout: TimeAmount) async throws -> [String: Any] {
        let data = try body.map { try JSONSerialization.data(withJSONObject: $0) }
        return try Self.decode(route, try await exchange(method, route, body: data, timeout: timeout).get())
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
            promise.fail(Failure(description: "Litestream did not answer \(route) within \(Double(timeout.nanoseconds / 1_000_000) / 1000) s"))
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
                    promise.fail(Failure(description: "cannot connect to Litestream's control socket \(socketPath): \(error)", delivered: false))
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
