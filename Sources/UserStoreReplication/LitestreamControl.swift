import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// Litestream's control socket: HTTP/1.1 with JSON bodies over a Unix socket (`socket:` in
/// Litestream's configuration; docs/notes/litestream-0.5.md lists the routes), through
/// AsyncHTTPClient (`http+unix`) with Codable bodies.
///
/// Each call comes in two forms: `async`, and blocking its thread until the reply (or its
/// deadline) — the blocking form only from the blocking pool, never from an event loop.
package struct LitestreamControl: Sendable {
    /// The control socket's path.
    package let socketPath: String

    /// The client every control call shares. Connections are kept alive and reused; a sync
    /// pass sends up to 64 `/sync` calls at once and durable writes each wait on one more, so
    /// the pool allows many more connections than AsyncHTTPClient's default 8 (a call queued
    /// behind others would spend its deadline waiting for a connection). A socket that refuses
    /// fails the call at once instead of being retried until the deadline.
    package static let http: HTTPClient = {
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(idleTimeout: .seconds(30), concurrentHTTP1ConnectionsPerHostSoftLimit: 512)
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.timeout.connect = .seconds(2)
        return HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
    }()

    /// A failed request: no connection, a timeout, or Litestream's error reply.
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
        /// Whether the request may have reached Litestream (false: the connection itself failed,
        /// so no Litestream acted on it).
        var delivered = true
    }

    /// A database's registration and unregistration go one at a time, each until Litestream
    /// answers it (``DatabaseRequests``): shared by every control client of the process, keyed
    /// by socket and database.
    package static let requests = DatabaseRequests()

    /// `POST /register`: replicate the database at `path` to `replicaURL`; answered by `until`
    /// (10 s from now unless given) at the latest (blocking).
    package func register(_ path: String, replicaURL: String, until deadline: ContinuousClock.Instant = .now + .seconds(10)) throws {
        _ = try Self.wait(forDatabase(path, .POST, "/register", Register(path: path, replicaURL: replicaURL), until: Self.nio(deadline), reply: Ignored.self))
    }

    /// ``register(_:replicaURL:until:)`` without blocking a thread.
    package func register(_ path: String, replicaURL: String, until deadline: ContinuousClock.Instant = .now + .seconds(10)) async throws {
        _ = try await Self.get(forDatabase(path, .POST, "/register", Register(path: path, replicaURL: replicaURL), until: Self.nio(deadline), reply: Ignored.self))
    }

    /// `POST /unregister`: a final sync, then stop replicating `path` and close Litestream's
    /// connection to it; answered by `until` at the latest (blocking).
    package func unregister(_ path: String, until deadline: ContinuousClock.Instant) throws {
        _ = try Self.wait(forDatabase(path, .POST, "/unregister", Unregister(path: path, timeout: Self.seconds(until: deadline)), until: Self.nio(deadline), reply: Ignored.self))
    }

    /// ``unregister(_:until:)`` without blocking a thread.
    package func unregister(_ path: String, until deadline: ContinuousClock.Instant) async throws {
        _ = try await Self.get(forDatabase(path, .POST, "/unregister", Unregister(path: path, timeout: Self.seconds(until: deadline)), until: Self.nio(deadline), reply: Ignored.self))
    }

    /// `POST /sync` with `wait`: returns once every transaction committed before the call is in
    /// the replica (`replicated_txid`), or throws — by `until` at the latest (blocking).
    /// Not queued behind the database's registration requests (``requests``): Litestream runs
    /// the syncs of one database object one at a time itself, and a sync that finds no database
    /// (not yet registered, or let go of) fails without touching anything.
    package func syncAndWait(_ path: String, until deadline: ContinuousClock.Instant) throws -> SyncReply {
        try call(.POST, "/sync", Sync(path: path, timeout: Self.seconds(until: deadline)), timeout: Self.left(until: deadline), reply: SyncReply.self)
    }

    /// ``syncAndWait(_:until:)`` without blocking a thread (durable writes wait here).
    package func syncAndWait(_ path: String, until deadline: ContinuousClock.Instant) async throws -> SyncReply {
        try await call(.POST, "/sync", Sync(path: path, timeout: Self.seconds(until: deadline)), timeout: Self.left(until: deadline), reply: SyncReply.self)
    }

    /// `deadline` on NIO's clock.
    private static func nio(_ deadline: ContinuousClock.Instant) -> NIODeadline {
        .now() + left(until: deadline)
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

    // MARK: Bodies

    private struct Register: Encodable {
        let path: String
        let replicaURL: String
        enum CodingKeys: String, CodingKey { case path, replicaURL = "replica_url" }
    }

    private struct Unregister: Encodable {
        let path: String
        let timeout: Int
    }

    private struct Sync: Encodable {
        let path: String
        let wait = true
        let timeout: Int
    }

    /// A body of nothing: the reply nothing reads (its status says it all), the GET that sends none.
    private struct Ignored: Codable {}

    /// What `/sync` answered: `synced`, `synced_local` or `no_change`, and the positions.
    package struct SyncReply: Decodable {
        let status: String
        let txid: Int64
        let replicatedTXID: Int64

        enum CodingKeys: String, CodingKey { case status, txid, replicatedTXID = "replicated_txid" }

        package init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            status = try container.decodeIfPresent(String.self, forKey: .status) ?? ""
            txid = try container.decodeIfPresent(Int64.self, forKey: .txid) ?? 0
            replicatedTXID = try container.decodeIfPresent(Int64.self, forKey: .replicatedTXID) ?? 0
        }

        /// Whether the replica holds everything the sync covered (`no_change` too: with `wait`,
        /// Litestream ships to the replica even when its local position did not move).
        var isReplicated: Bool { ["no_change", "synced"].contains(status) && replicatedTXID >= txid }
    }

    /// `GET /list`: every registered database and its state.
    package func list() async throws -> [ListedDatabase] {
        try await call(.GET, "/list", Optional<Ignored>.none, timeout: .seconds(5), reply: Listed.self).databases ?? []
    }

    private struct Listed: Decodable {
        let databases: [ListedDatabase]?
    }

    /// One database in `/list`.
    package struct ListedDatabase: Decodable {
        let path: String
        /// `replicating`, `open` or `stopped`.
        let status: String
        let lastSyncAt: Date?

        enum CodingKeys: String, CodingKey { case path, status, lastSyncAt = "last_sync_at" }

        package init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            path = try container.decodeIfPresent(String.self, forKey: .path) ?? ""
            status = try container.decodeIfPresent(String.self, forKey: .status) ?? ""
            lastSyncAt = try container.decodeIfPresent(String.self, forKey: .lastSyncAt).flatMap(RFC3339.parse)
        }
    }

    /// Which Litestream answers: its pid and when it started (`GET /info`).
    package struct Instance: Equatable, Decodable {
        let pid: Int32
        let startedAt: String
        let version: String

        enum CodingKeys: String, CodingKey { case pid, startedAt = "started_at", version }

        init(pid: Int32, startedAt: String, version: String) {
            self.pid = pid
            self.startedAt = startedAt
            self.version = version
        }

        package init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            pid = try container.decodeIfPresent(Int32.self, forKey: .pid) ?? 0
            startedAt = try container.decodeIfPresent(String.self, forKey: .startedAt) ?? ""
            version = try container.decodeIfPresent(String.self, forKey: .version) ?? ""
        }
    }

    /// `GET /info`: which Litestream answers (throws when none does within 5 s).
    package func info() async throws -> Instance {
        try await call(.GET, "/info", Optional<Ignored>.none, timeout: .seconds(5), reply: Instance.self)
    }

    // MARK: HTTP

    /// Litestream's error body: `{"error": "…"}`.
    private struct ErrorReply: Decodable {
        let error: String
    }

    /// One request outside the registration queue (`/info`, `/list`, `/sync`), blocking its
    /// thread until the reply (or `timeout`, when the connection is closed).
    private func call<Body: Encodable, Reply: Decodable>(_ method: HTTPMethod, _ route: String, _ body: Body?, timeout: TimeAmount,
                                                         reply: Reply.Type) throws -> Reply {
        let request = try makeRequest(method, route, body)
        let response: HTTPClient.Response
        do {
            response = try Self.http.execute(request: request, deadline: .now() + timeout).wait()
        } catch {
            throw Self.failure(route, error, timeout: timeout)
        }
        return try Self.decode(route, response, as: Reply.self)
    }

    /// ``call(_:_:_:timeout:reply:)`` without blocking a thread.
    private func call<Body: Encodable, Reply: Decodable>(_ method: HTTPMethod, _ route: String, _ body: Body?, timeout: TimeAmount,
                                                         reply: Reply.Type) async throws -> Reply {
        let request = try makeRequest(method, route, body)
        let response: HTTPClient.Response
        do {
            response = try await Self.http.execute(request: request, deadline: .now() + timeout).get()
        } catch {
            throw Self.failure(route, error, timeout: timeout)
        }
        return try Self.decode(route, response, as: Reply.self)
    }

    /// A registration or unregistration of the database at `path`, in its turn (``requests``): the answer, or a
    /// failure at `deadline`. The request itself has no time limit here — one the daemon stopped
    /// waiting for keeps the database's turn until Litestream answers it or ends.
    private func forDatabase<Body: Encodable, Reply: Decodable & Sendable>(
        _ path: String, _ method: HTTPMethod, _ route: String, _ body: Body, until deadline: NIODeadline, reply: Reply.Type
    ) -> EventLoopFuture<Reply> {
        let started = NIODeadline.now()
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        let request: HTTPClient.Request
        do {
            request = try makeRequest(method, route, body)
        } catch {
            return loop.makeFailedFuture(error)
        }
        return Self.requests.send(socketPath + "\u{0}" + path, route: route, until: deadline) {
            Self.http.execute(request: request, deadline: nil).flatMapThrowing { try Self.decode(route, $0, as: Reply.self) }
        }.flatMapErrorThrowing { error in
            if error is Failure { throw error }
            throw Self.failure(route, error, timeout: deadline - started)
        }
    }

    /// Waits for `future` on this thread (the blocking pool's, never an event loop's).
    private static func wait<Reply: Sendable>(_ future: EventLoopFuture<Reply>) throws -> Reply { try future.wait() }

    /// Waits for `future` without blocking a thread.
    private static func get<Reply: Sendable>(_ future: EventLoopFuture<Reply>) async throws -> Reply { try await future.get() }

    private func makeRequest<Body: Encodable>(_ method: HTTPMethod, _ route: String, _ body: Body?) throws -> HTTPClient.Request {
        guard let url = URL(httpURLWithSocketPath: socketPath, uri: route) else {
            throw Failure(description: "Litestream's control socket path \(socketPath) cannot be put in a URL", delivered: false)
        }
        // Go's HTTP/1.1 server refuses a request without Host (400), and AsyncHTTPClient sends
        // none to a Unix socket.
        var headers: HTTPHeaders = ["Host": "litestream"]
        var payload: HTTPClient.Body?
        if let body {
            headers.add(name: "Content-Type", value: "application/json")
            payload = .bytes(try JSONEncoder().encode(body))
        }
        return try HTTPClient.Request(url: url, method: method, headers: headers, body: payload)
    }

    /// What a request that got no reply is reported as. Only a connection that was never made
    /// counts as not delivered: anything else may have reached Litestream.
    private static func failure(_ route: String, _ error: any Error, timeout: TimeAmount) -> Failure {
        if let error = error as? DatabaseRequests.StillUnanswered {
            // Not sent, but the earlier request it waited for was: as undecided as a time-out.
            return Failure(description: "\(error)")
        }
        // The caller's deadline passed with the request sent: in flight (queued) or cut off.
        let timedOut = error is DatabaseRequests.NotAnswered || (error as? HTTPClientError).map { $0 == .deadlineExceeded || $0 == .readTimeout } == true
        if timedOut {
            return Failure(description: "Litestream did not answer \(route) within \(Double(timeout.nanoseconds / 1_000_000) / 1000) s")
        }
        if let error = error as? HTTPClientError, error == .connectTimeout {
            return Failure(description: "cannot connect to Litestream's control socket: \(error)", delivered: false)
        }
        if let error = error as? IOError, [ENOENT, ECONNREFUSED, ENOTSOCK, EACCES].contains(error.errnoCode) {
            return Failure(description: "cannot connect to Litestream's control socket: \(error)", delivered: false)
        }
        return Failure(description: "Litestream \(route): \(error)")
    }

    /// The reply decoded, or the error Litestream named.
    private static func decode<Reply: Decodable>(_ route: String, _ response: HTTPClient.Response, as: Reply.Type) throws -> Reply {
        let bytes = response.body.map { Data($0.readableBytesView) } ?? Data()
        guard response.status == .ok else {
            let message = (try? JSONDecoder().decode(ErrorReply.self, from: bytes))?.error
                ?? String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            throw Failure(description: "Litestream \(route): \(response.status.code) \(message)")
        }
        do {
            return try JSONDecoder().decode(Reply.self, from: bytes.isEmpty ? Data("{}".utf8) : bytes)
        } catch {
            throw Failure(description: "Litestream \(route): the reply is not what the daemon expects: \(error)")
        }
    }
}
