import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// The few S3 calls userstored makes itself — checking a bucket, listing a prefix, deleting what
/// is under it, reading and writing small objects, conditionally — signed with SigV4 over
/// AsyncHTTPClient: the host log's objects, folds and fences, erasing a user's copies
/// (`DeleteStore`), checking that the bucket answers, and the replica's marker and writer lease
/// (compare-and-swap with `If-None-Match` and `If-Match`).
public final class S3Client: Sendable {
    /// Where the bucket is served.
    public struct Endpoint: Sendable, Equatable {
        /// `http://host:port` or `https://host` (no path).
        public var url: String
        public var region: String
        /// Path-style addressing (`host/bucket/key`) instead of virtual hosts (`bucket.host/key`);
        /// what every S3-compatible server but AWS wants.
        public var pathStyle: Bool
        /// A PEM file of the CA certificates that sign a TLS endpoint (nil: the system's).
        public var caFile: String?

        public init(url: String, region: String, pathStyle: Bool, caFile: String? = nil) {
            self.url = url.hasSuffix("/") ? String(url.dropLast()) : url
            self.region = region
            self.pathStyle = pathStyle
            self.caFile = caFile
        }

        /// AWS's own endpoint for `region` (virtual-hosted).
        public static func aws(region: String) -> Endpoint {
            Endpoint(url: "https://s3.\(region).amazonaws.com", region: region, pathStyle: false)
        }
    }

    public let endpoint: Endpoint
    /// Requests sent and bytes sent (PUT) or received (GET) since the client was made, by S3
    /// operation (`PUT`, `GET`, `HEAD`, `LIST`, `DELETE`), whether they succeeded or not.
    public var traffic: Traffic { counted.withLock { $0 } }
    private let counted = Mutex(Traffic())
    private let signer: SigV4
    private let http: HTTPClient
    private let timeout: TimeAmount

    public init(endpoint: Endpoint, credentials: S3Credentials, timeout: Duration = .seconds(30)) throws {
        self.endpoint = endpoint
        self.signer = SigV4(credentials: credentials, region: endpoint.region)
        self.http = try Self.httpClient(caFile: endpoint.caFile)
        self.timeout = .nanoseconds(Int64(timeout.components.seconds) * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000)
    }

    // MARK: Calls

    /// Whether `bucket` exists and these credentials may use it (`HEAD` the bucket).
    public func checkBucket(_ bucket: String) async throws(S3Error) {
        _ = try await send("HEAD", bucket: bucket, key: "", query: [], body: nil)
    }

    /// Every key under `prefix` (all pages); with a `delimiter`, also the common prefixes (the
    /// "folders" one level down) instead of the keys below them.
    public func list(bucket: String, prefix: String, delimiter: String? = nil, pageSize: Int? = nil) async throws(S3Error) -> (keys: [String], prefixes: [String]) {
        var keys: [String] = [], prefixes: [String] = []
        var token: String?
        repeat {
            // No empty `prefix=`: SeaweedFS then signs a query other than the one sent.
            var query = [("list-type", "2"), ("encoding-type", "url")]
            if !prefix.isEmpty { query.append(("prefix", prefix)) }
            if let pageSize { query.append(("max-keys", String(pageSize))) }
            if let delimiter { query.append(("delimiter", delimiter)) }
            if let token { query.append(("continuation-token", token)) }
            let page = ListPage(try await send("GET", bucket: bucket, key: "", query: query, body: nil))
            keys += page.keys
            prefixes += page.prefixes
            token = page.nextToken
        } while token != nil
        return (keys, prefixes)
    }

    /// Whether any key starts with `prefix`: one `ListObjectsV2` request for at most one key.
    public func holdsAny(bucket: String, prefix: String) async throws(S3Error) -> Bool {
        var query = [("list-type", "2"), ("encoding-type", "url"), ("max-keys", "1")]
        if !prefix.isEmpty { query.append(("prefix", prefix)) }
        return !ListPage(try await send("GET", bucket: bucket, key: "", query: query, body: nil)).keys.isEmpty
    }

    /// The first `count` keys under `prefix` in key order: one `ListObjectsV2` request.
    public func firstKeys(bucket: String, prefix: String, count: Int) async throws(S3Error) -> [String] {
        var query = [("list-type", "2"), ("encoding-type", "url"), ("max-keys", String(count))]
        if !prefix.isEmpty { query.append(("prefix", prefix)) }
        return ListPage(try await send("GET", bucket: bucket, key: "", query: query, body: nil)).keys
    }

    /// Deletes `keys` (`DeleteObjects`, 1,000 per request); throws when any was not deleted.
    public func delete(bucket: String, keys: [String]) async throws(S3Error) {
        for start in stride(from: 0, to: keys.count, by: 1000) {
            let batch = keys[start..<min(keys.count, start + 1000)]
            let body = "<Delete><Quiet>true</Quiet>" + batch.map { "<Object><Key>\(ListPage.escape($0))</Key></Object>" }.joined() + "</Delete>"
            let reply = try await send("POST", bucket: bucket, key: "", query: [("delete", "")], body: Data(body.utf8))
            if let failure = ListPage.errors(in: reply).first {
                throw .failed(status: 200, code: failure.code, message: "deleting \(failure.key): \(failure.message)")
            }
        }
    }

    /// Deletes every object under `prefix`, listing again until nothing is left; returns how
    /// many it deleted.
    @discardableResult
    public func deleteAll(bucket: String, prefix: String) async throws(S3Error) -> Int {
        var deleted = 0
        while true {
            let keys = try await list(bucket: bucket, prefix: prefix).keys
            if keys.isEmpty { return deleted }
            try await delete(bucket: bucket, keys: keys)
            deleted += keys.count
        }
    }

    /// An object's bytes and its entity tag, as ``getObject(bucket:key:)`` reads them.
    public struct Object: Sendable, Equatable {
        public var body: Data
        /// The `ETag` the server sent (quoted, as sent): what ``putObject(bucket:key:body:condition:)``'s
        /// `.ifMatch` compares.
        public var etag: String
    }

    /// `key`'s bytes (only those in `range`, when given: a ranged GET) and entity tag; nil when
    /// there is no such key (404 `NoSuchKey`).
    public func getObject(bucket: String, key: String, range: Range<Int>? = nil) async throws(S3Error) -> Object? {
        do {
            let headers = range.map { [("range", "bytes=\($0.lowerBound)-\($0.upperBound - 1)")] } ?? []
            let reply = try await request("GET", bucket: bucket, key: key, query: [], body: nil, headers: headers)
            return Object(body: reply.body, etag: reply.etag ?? "")
        } catch .failed(404, "NoSuchKey", _) {
            return nil
        } catch .failed(416, _, _) where range != nil {
            return Object(body: Data(), etag: "") // an empty object has no first bytes
        }
    }

    /// What a ``putObject(bucket:key:body:condition:)`` requires of the object already there.
    public enum WriteCondition: Sendable, Equatable {
        /// Written whatever is there.
        case none
        /// Written only if there is no object at the key (`If-None-Match: *`).
        case absent
        /// Written only if the object there has this entity tag (`If-Match`).
        case matching(String)
    }

    /// Writes `body` at `key` when `condition` holds; returns the new entity tag, or nil when the
    /// server refused because it does not (412 `PreconditionFailed`, or 409 `ConditionalRequestConflict`
    /// when another conditional write to the key raced this one). Not sent twice after a failure
    /// without an answer (a conditional write that may have landed is for the caller to read back).
    public func putObject(bucket: String, key: String, body: Data, condition: WriteCondition = .none) async throws(S3Error) -> String? {
        var headers: [(String, String)] = []
        switch condition {
        case .none: break
        case .absent: headers.append(("if-none-match", "*"))
        case .matching(let etag): headers.append(("if-match", etag))
        }
        do {
            let reply = try await request("PUT", bucket: bucket, key: key, query: [], body: body, contentType: "application/octet-stream",
                                          headers: headers, idempotent: condition == .none)
            return reply.etag ?? ""
        } catch .failed(412, _, _), .failed(409, "ConditionalRequestConflict", _) {
            return nil
        }
    }

    /// Deletes the object at `key` (nothing happens when there is none).
    public func deleteObject(bucket: String, key: String) async throws(S3Error) {
        _ = try await request("DELETE", bucket: bucket, key: key, query: [], body: nil)
    }

    // MARK: HTTP

    /// A reply's body and entity tag.
    private struct Reply {
        var body: Data
        var etag: String?
    }

    /// Requests and bytes by S3 operation.
    public struct Traffic: Sendable, Equatable {
        public var requests: [String: Int64] = [:]
        public var bytes: [String: Int64] = [:]

        public init() {}
    }

    /// The S3 operation a request is: `LIST` for a GET of a bucket, `DELETE` for the batch delete
    /// (a POST with `?delete`), else its method.
    private static func operation(_ method: String, key: String, query: [(String, String)]) -> String {
        if method == "GET" && key.isEmpty { return "LIST" }
        if method == "POST" && query.contains(where: { $0.0 == "delete" }) { return "DELETE" }
        return method
    }

    /// One signed request; returns the reply's body, or throws the error it names.
    private func send(_ method: String, bucket: String, key: String, query: [(String, String)], body: Data?) async throws(S3Error) -> Data {
        try await request(method, bucket: bucket, key: key, query: query, body: body).body
    }

    /// One signed request with `headers` besides the signed ones; returns the reply, or throws
    /// the error it names. `idempotent`: sent again once when it fails before an answer.
    private func request(_ method: String, bucket: String, key: String, query: [(String, String)], body: Data?,
                         contentType: String = "application/xml", headers extra: [(String, String)] = [],
                         idempotent: Bool = true) async throws(S3Error) -> Reply {
        guard let base = URLComponents(string: endpoint.url), let scheme = base.scheme, let hostName = base.host else {
            throw .failed(status: 0, code: "InvalidEndpoint", message: "not a URL: \(endpoint.url)")
        }
        let port = base.port.map { ":\($0)" } ?? ""
        let host = endpoint.pathStyle ? hostName + port : "\(bucket).\(hostName)\(port)"
        let objectPath = key.isEmpty ? "" : "/" + SigV4.encode(key, keepingSlash: true)
        let path = (endpoint.pathStyle ? "/" + SigV4.encode(bucket) : "") + (objectPath.isEmpty && !endpoint.pathStyle ? "/" : objectPath)
        let queryString = SigV4.canonicalQuery(query)
        var request = HTTPClientRequest(url: "\(scheme)://\(host)\(path)" + (queryString.isEmpty ? "" : "?" + queryString))
        request.method = HTTPMethod(rawValue: method)
        var signedHeaders = [("host", host)]
        if let body {
            signedHeaders.append(("content-md5", Data(Insecure.MD5.hash(data: body)).base64EncodedString()))
            signedHeaders.append(("content-type", contentType))
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let payloadHash = body.map { SigV4.hex(SHA256.hash(data: $0)) } ?? SigV4.emptyPayloadHash
        signedHeaders += extra
        for (name, value) in signedHeaders { request.headers.add(name: name, value: value) }
        for (name, value) in signer.headers(method: method, path: path, query: query, headers: signedHeaders, payloadHash: payloadHash, date: Date()) {
            request.headers.add(name: name, value: value)
        }
        var status = 0
        var reply = Data()
        var etag: String?
        // An idempotent request (GET, HEAD, a whole PUT, DELETE) that fails before an answer is
        // sent again, within the same time-out. A pooled keep-alive connection the server or a
        // proxy has closed fails that way at once ("I/O on closed channel"); after an outage the
        // pool may hold several such, each dropped as it fails (CI: the one retry met a second
        // dead connection), so up to three more tries while half the time-out is left.
        let deadline = NIODeadline.now() + timeout
        let operation = Self.operation(method, key: key, query: query)
        let attempts = 4
        for attempt in 1...attempts {
            counted.withLock { traffic in
                traffic.requests[operation, default: 0] += 1
                traffic.bytes[operation, default: 0] += Int64(body?.count ?? 0)
            }
            do {
                let response = try await http.execute(request, deadline: deadline)
                status = Int(response.status.code)
                etag = response.headers.first(name: "etag")
                var body = try await response.body.collect(upTo: 64 << 20)
                reply = body.readData(length: body.readableBytes) ?? Data()
                if method == "GET" { counted.withLock { $0.bytes[operation, default: 0] += Int64(reply.count) } }
                break
            } catch {
                guard idempotent, attempt < attempts, deadline - .now() > .nanoseconds(timeout.nanoseconds / 2) else { throw .unreachable("\(endpoint.url): \(error)") }
            }
        }
        guard (200..<300).contains(status) else { throw Self.error(status: status, body: reply, bucket: bucket) }
        return Reply(body: reply, etag: etag)
    }

    /// The error an error reply names (a HEAD's has no body: its status says it).
    private static func error(status: Int, body: Data, bucket: String) -> S3Error {
        let code = ListPage.text(of: "Code", in: body) ?? (status == 404 ? "NoSuchBucket" : status == 403 ? "AccessDenied" : "HTTP\(status)")
        let message = ListPage.text(of: "Message", in: body) ?? HTTPResponseStatus(statusCode: status).reasonPhrase
        switch code {
        case "NoSuchBucket": return .noSuchBucket(bucket)
        case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AccountProblem":
            return .accessDenied("\(code): \(message)")
        default: return .failed(status: status, code: code, message: message)
        }
    }

    /// One HTTP client per CA file, for the life of the process (AsyncHTTPClient wants a client
    /// shut down before it goes; the daemon's live as long as it does).
    private static let clients = Mutex<[String: HTTPClient]>([:])

    private static func httpClient(caFile: String?) throws -> HTTPClient {
        try clients.withLock { clients in
            if let client = clients[caFile ?? ""] { return client }
            var configuration = HTTPClient.Configuration()
            configuration.connectionPool.retryConnectionEstablishment = false
            configuration.timeout.connect = .seconds(5)
            if let caFile {
                var tls = TLSConfiguration.makeClientConfiguration()
                tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(caFile))
                configuration.tlsConfiguration = tls
            }
            let client = HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
            clients[caFile ?? ""] = client
            return client
        }
    }
}
