import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// An etcd v3 client over etcd's JSON gateway (`POST /v3/...`, base64 keys and values, 64-bit
/// integers as strings), with the few calls userstore's placement needs: reads, puts,
/// create-if-absent and compare-and-swap transactions, and leases.
///
/// Several endpoints (the cluster's members) are tried in turn. A call that never reached a
/// member (refused, connect time-out) goes to the next one, and so does a read that failed in
/// any way; a write that may have reached a member fails with ``EtcdError/ambiguous(_:)``, since
/// it may have been applied (the caller reads back: a compare-and-swap that did apply shows up
/// as the caller's own value).
public final class EtcdClient: Sendable {
    /// The members' client URLs (`http://127.0.0.1:2379`).
    public let endpoints: [String]
    private let requestTimeout: TimeAmount
    private let http: HTTPClient
    /// The member that answered last: tried first next time.
    private let preferred = Mutex(0)

    /// The HTTP client etcd calls share: a member that refuses connections fails the call at
    /// once (AsyncHTTPClient's default retries the connection until the call's deadline, which
    /// made every call to a dead member cost the whole time-out before the next was tried).
    public static let sharedHTTPClient: HTTPClient = {
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.timeout.connect = .seconds(1)
        return HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
    }()

    public init(endpoints: [String], requestTimeout: Duration = .seconds(5), httpClient: HTTPClient = EtcdClient.sharedHTTPClient) {
        precondition(!endpoints.isEmpty, "etcd needs at least one endpoint")
        self.endpoints = endpoints.map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
        self.requestTimeout = .nanoseconds(Int64(requestTimeout.components.seconds) * 1_000_000_000 + requestTimeout.components.attoseconds / 1_000_000_000)
        self.http = httpClient
    }

    // MARK: Keys

    /// The key's current value, or nil.
    public func get(_ key: String) async throws(EtcdError) -> EtcdKeyValue? {
        let reply = try await call("/v3/kv/range", EtcdWire.Range(key: Self.base64(key)), idempotent: true, as: EtcdWire.RangeReply.self)
        return try Self.keyValues(reply.kvs).first
    }

    /// Every key that starts with `prefix`, in key order.
    public func list(prefix: String) async throws(EtcdError) -> [EtcdKeyValue] {
        try await snapshot(prefix: prefix).keys
    }

    /// Every key under `prefix` and the store revision they were read at (a watch from the
    /// next revision misses nothing).
    public func snapshot(prefix: String) async throws(EtcdError) -> (keys: [EtcdKeyValue], revision: Int64) {
        let range = EtcdWire.Range(key: Self.base64(prefix), range_end: Self.base64(Self.rangeEnd(of: prefix)))
        let reply = try await call("/v3/kv/range", range, idempotent: true, as: EtcdWire.RangeReply.self)
        return (try Self.keyValues(reply.kvs), try Self.revision(reply.header))
    }

    /// The changes to keys under `prefix` from store revision `revision` on, in order, as
    /// etcd's watch delivers them (one element per reply). The stream ends with an error when
    /// the member goes away or the revision was compacted; the caller takes a new
    /// ``snapshot(prefix:)`` and watches again.
    public func watch(prefix: String, fromRevision revision: Int64) -> AsyncThrowingStream<[EtcdEvent], any Error> {
        let create = EtcdWire.Watch.Create(key: Self.base64(prefix), range_end: Self.base64(Self.rangeEnd(of: prefix)), start_revision: .init(revision))
        let body = (try? JSONEncoder().encode(EtcdWire.Watch(create_request: create))) ?? Data()
        let endpoint = endpoints[preferred.withLock { $0 }]
        let http = self.http
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    var request = HTTPClientRequest(url: endpoint + "/v3/watch")
                    request.method = .POST
                    request.body = .bytes(ByteBuffer(bytes: body))
                    // A watch lasts as long as its consumer: only the connection is timed.
                    let response = try await http.execute(request, deadline: .distantFuture)
                    guard response.status == .ok else { throw EtcdError.server(code: Int(response.status.code), message: "watch: \(response.status)") }
                    var pending: [UInt8] = []
                    for try await chunk in response.body {
                        pending += chunk.readableBytesView
                        while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                            let line = Array(pending[..<newline])
                            pending.removeSubrange(...newline)
                            continuation.yield(try Self.watchEvents(line))
                        }
                    }
                    throw EtcdError.unavailable("the watch on \(endpoint) ended")
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// One watch reply's events; throws when etcd cancelled the watch (compaction).
    private static func watchEvents(_ line: [UInt8]) throws(EtcdError) -> [EtcdEvent] {
        let reply: EtcdWire.WatchReply
        do { reply = try JSONDecoder().decode(EtcdWire.WatchReply.self, from: Data(line)) } catch {
            throw .protocolViolation("a watch reply userstore cannot read: \(error)")
        }
        guard let result = reply.result else {
            throw .server(code: Int(reply.code?.value ?? 0), message: reply.message ?? "watch failed: \(String(decoding: line, as: UTF8.self))")
        }
        if result.canceled == true {
            throw .server(code: 0, message: "watch cancelled: \(result.cancel_reason ?? "") (compacted to \(result.compact_revision?.value ?? 0))")
        }
        return try (result.events ?? []).map { event throws(EtcdError) in
            guard let kv = event.kv else { throw .protocolViolation("a watch event without its key") }
            return EtcdEvent(deleted: event.type == "DELETE", keyValue: try keyValue(kv))
        }
    }

    /// Sets `key` (bound to `lease` if given: deleted when the lease ends); returns the store's
    /// revision after the put (the key's new `modRevision`).
    @discardableResult
    public func put(_ key: String, _ value: String, lease: Int64? = nil) async throws(EtcdError) -> Int64 {
        let put = EtcdWire.Put(key: Self.base64(key), value: Self.base64(value), lease: lease.map(EtcdWire.Number.init))
        let reply = try await call("/v3/kv/put", put, idempotent: false, as: EtcdWire.Reply.self)
        return try Self.revision(reply.header)
    }

    /// Deletes `key`; returns whether it existed.
    @discardableResult
    public func delete(_ key: String) async throws(EtcdError) -> Bool {
        let reply = try await call("/v3/kv/deleterange", EtcdWire.DeleteRange(key: Self.base64(key)), idempotent: false, as: EtcdWire.DeleteRangeReply.self)
        return (reply.deleted?.value ?? 0) > 0
    }

    /// Creates `key` only if it does not exist (one transaction: `create_revision == 0`).
    /// Returns whether this call created it, and the key as it is now (the winner's value
    /// when another caller created it first).
    public func create(_ key: String, _ value: String, lease: Int64? = nil) async throws(EtcdError) -> (created: Bool, current: EtcdKeyValue) {
        let put = EtcdWire.Put(key: Self.base64(key), value: Self.base64(value), lease: lease.map(EtcdWire.Number.init))
        let transaction = EtcdWire.Transaction(compare: [Self.absent(key)], success: [.init(request_put: put)],
                                               failure: [.init(request_range: .init(key: Self.base64(key)))])
        let reply = try await call("/v3/kv/txn", transaction, idempotent: false, as: EtcdWire.TransactionReply.self)
        if reply.succeeded == true {
            let revision = try Self.revision(reply.header)
            return (true, EtcdKeyValue(key: key, value: Array(value.utf8), createRevision: revision, modRevision: revision, version: 1, lease: lease ?? 0))
        }
        guard let current = try Self.keyValues(reply.responses?.first?.response_range?.kvs).first else {
            // Created and deleted again between the compare and the read: a race to retry.
            throw .ambiguous("\(key) existed at the compare and not at the read")
        }
        return (false, current)
    }

    /// Sets `key` to `value` only if its `modRevision` is still `expected` (0: only if absent).
    /// Returns the new `modRevision` (the key's next epoch), or nil when somebody changed the
    /// key first.
    public func swap(_ key: String, expectedModRevision expected: Int64, to value: String) async throws(EtcdError) -> Int64? {
        let transaction = EtcdWire.Transaction(compare: [Self.unchanged(key, since: expected)],
                                               success: [.init(request_put: .init(key: Self.base64(key), value: Self.base64(value)))])
        let reply = try await call("/v3/kv/txn", transaction, idempotent: false, as: EtcdWire.TransactionReply.self)
        guard reply.succeeded == true else { return nil }
        return try Self.revision(reply.header)
    }

    /// One transaction that writes every key of `changes` only if each still has its expected
    /// `modRevision` (0: absent) and, with `guardedBy`, that key is still bound to that lease
    /// (the controller fences its writes with its election key). Returns the new revision (every
    /// written key's new `modRevision`), or nil when any comparison failed and nothing was
    /// written. etcd takes at most 128 comparisons (the guard included) and 128 writes per
    /// transaction (`--max-txn-ops`).
    public func swapAll(_ changes: [(key: String, expectedModRevision: Int64, value: String)],
                        guardedBy guardKey: (key: String, lease: Int64)? = nil) async throws(EtcdError) -> Int64? {
        precondition(changes.count + (guardKey == nil ? 0 : 1) <= 128, "etcd takes at most 128 comparisons per transaction")
        var compares = changes.map { Self.unchanged($0.key, since: $0.expectedModRevision) }
        if let guardKey {
            compares.append(EtcdWire.Compare(key: Self.base64(guardKey.key), target: "LEASE", lease: .init(guardKey.lease)))
        }
        let puts = changes.map { EtcdWire.Operation(request_put: .init(key: Self.base64($0.key), value: Self.base64($0.value))) }
        let reply = try await call("/v3/kv/txn", EtcdWire.Transaction(compare: compares, success: puts), idempotent: false, as: EtcdWire.TransactionReply.self)
        guard reply.succeeded == true else { return nil }
        return try Self.revision(reply.header)
    }

    /// Writes every key of `puts` and deletes every key of `deletes` in one transaction (at most
    /// 128 operations); returns the new revision.
    @discardableResult
    public func write(puts: [(key: String, value: String)] = [], deletes: [String] = []) async throws(EtcdError) -> Int64 {
        precondition(puts.count + deletes.count <= 128, "etcd takes at most 128 operations per transaction")
        let operations = puts.map { EtcdWire.Operation(request_put: .init(key: Self.base64($0.key), value: Self.base64($0.value))) }
            + deletes.map { EtcdWire.Operation(request_delete_range: .init(key: Self.base64($0))) }
        let reply = try await call("/v3/kv/txn", EtcdWire.Transaction(success: operations), idempotent: false, as: EtcdWire.TransactionReply.self)
        return try Self.revision(reply.header)
    }

    // MARK: Leases

    /// A new lease of `ttlSeconds`; keys bound to it go when it ends.
    public func grantLease(ttlSeconds: Int) async throws(EtcdError) -> EtcdLease {
        let reply = try await call("/v3/lease/grant", EtcdWire.LeaseGrant(TTL: .init(Int64(ttlSeconds))), idempotent: false, as: EtcdWire.LeaseGrantReply.self)
        guard let id = reply.ID?.value, id != 0 else { throw .protocolViolation("lease/grant answered without an ID") }
        return EtcdLease(id: id, ttlSeconds: Int(reply.TTL?.value ?? 0))
    }

    /// Renews `lease`; returns the TTL it has again, 0 when it has already ended.
    public func keepAlive(_ lease: Int64) async throws(EtcdError) -> Int {
        let reply = try await call("/v3/lease/keepalive", EtcdWire.LeaseID(ID: .init(lease)), idempotent: true, as: EtcdWire.KeepAliveReply.self)
        guard let result = reply.result else { throw .protocolViolation("lease/keepalive answered without a result") }
        return Int(result.TTL?.value ?? 0)
    }

    /// Ends `lease` now, deleting its keys (a lease already gone is not an error).
    public func revokeLease(_ lease: Int64) async throws(EtcdError) {
        do {
            _ = try await call("/v3/lease/revoke", EtcdWire.LeaseID(ID: .init(lease)), idempotent: true, as: EtcdWire.Reply.self)
        } catch .server(_, let message) where message.contains("lease not found") {
            return
        }
    }

    // MARK: Transport

    /// POSTs `body` to `route` on the preferred member (then the others, as the type's doc says)
    /// and decodes the reply as `Reply`.
    private func call<Body: Encodable, Reply: Decodable>(_ route: String, _ body: Body, idempotent: Bool,
                                                         as: Reply.Type) async throws(EtcdError) -> Reply {
        let data: Data
        do { data = try JSONEncoder().encode(body) } catch { throw .protocolViolation("encoding \(route): \(error)") }
        let first = preferred.withLock { $0 }
        var failures: [String] = []
        for attempt in 0..<endpoints.count {
            let index = (first + attempt) % endpoints.count
            let endpoint = endpoints[index]
            var request = HTTPClientRequest(url: endpoint + route)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: data))
            let status: HTTPResponseStatus
            let bytes: ByteBuffer
            do {
                let response = try await http.execute(request, timeout: requestTimeout)
                status = response.status
                bytes = try await response.body.collect(upTo: 16 << 20)
            } catch {
                failures.append("\(endpoint): \(error)")
                if idempotent || Self.neverSent(error) { continue }
                throw .ambiguous("\(route) to \(endpoint): \(error); it may have been applied")
            }
            let json = Data(bytes.readableBytesView)
            if status == .ok {
                do {
                    let reply = try JSONDecoder().decode(Reply.self, from: json)
                    preferred.withLock { $0 = index }
                    return reply
                } catch {
                    throw .protocolViolation("\(route): \(error)")
                }
            }
            let reply = try? JSONDecoder().decode(EtcdWire.ErrorReply.self, from: json)
            let code = Int(reply?.code?.value ?? 0)
            let message = reply?.message ?? reply?.error ?? String(buffer: bytes)
            // 14 UNAVAILABLE (no leader, request timed out, not enough members): another
            // member may do better for a read; a write may have been applied.
            if code == 14 {
                failures.append("\(endpoint): \(message)")
                if idempotent { continue }
                throw .ambiguous("\(route) to \(endpoint): \(message); it may have been applied")
            }
            throw .server(code: code, message: message)
        }
        throw .unavailable(failures.joined(separator: "; "))
    }

    /// Whether `error` happened before the request could reach the member.
    private static func neverSent(_ error: any Error) -> Bool {
        if let error = error as? HTTPClientError, error == .connectTimeout { return true }
        if error is NIOConnectionError { return true }
        if let error = error as? IOError, [ECONNREFUSED, ENETUNREACH, EHOSTUNREACH].contains(error.errnoCode) { return true }
        return false
    }

    // MARK: JSON

    static func base64(_ text: String) -> String { Data(text.utf8).base64EncodedString() }

    /// The key just after every key starting with `prefix` (etcd's `range_end` for a prefix).
    static func rangeEnd(of prefix: String) -> String {
        var bytes = Array(prefix.utf8)
        while let last = bytes.last {
            if last < 0xFF {
                bytes[bytes.count - 1] = last + 1
                return String(decoding: bytes, as: UTF8.self)
            }
            bytes.removeLast()
        }
        return "\0"
    }

    /// A comparison that holds while `key` does not exist.
    private static func absent(_ key: String) -> EtcdWire.Compare {
        EtcdWire.Compare(key: base64(key), target: "CREATE", create_revision: .init(0))
    }

    /// A comparison that holds while `key` was last changed at `modRevision` (0: absent).
    private static func unchanged(_ key: String, since modRevision: Int64) -> EtcdWire.Compare {
        modRevision == 0 ? absent(key) : EtcdWire.Compare(key: base64(key), target: "MOD", mod_revision: .init(modRevision))
    }

    private static func revision(_ header: EtcdWire.Header?) throws(EtcdError) -> Int64 {
        guard let revision = header?.revision?.value, revision > 0 else { throw .protocolViolation("a reply without a revision") }
        return revision
    }

    private static func keyValues(_ list: [EtcdWire.KeyValue]?) throws(EtcdError) -> [EtcdKeyValue] {
        try (list ?? []).map { item throws(EtcdError) in try keyValue(item) }
    }

    private static func keyValue(_ item: EtcdWire.KeyValue) throws(EtcdError) -> EtcdKeyValue {
        guard let key = item.key.flatMap({ Data(base64Encoded: $0) }) else {
            throw .protocolViolation("a key that is not base64: \(item.key ?? "none")")
        }
        let value = item.value.flatMap { Data(base64Encoded: $0) } ?? Data()
        return EtcdKeyValue(key: String(decoding: key, as: UTF8.self), value: [UInt8](value),
                            createRevision: item.create_revision?.value ?? 0, modRevision: item.mod_revision?.value ?? 0,
                            version: item.version?.value ?? 0, lease: item.lease?.value ?? 0)
    }
}

/// One change a watch delivers: the key after a put, or the deleted key.
public struct EtcdEvent: Sendable, Equatable {
    public let deleted: Bool
    public let keyValue: EtcdKeyValue
}

/// One key as etcd holds it.
public struct EtcdKeyValue: Sendable, Equatable {
    public let key: String
    public let value: [UInt8]
    /// The store revision that created the key (0: it does not exist).
    public let createRevision: Int64
    /// The store revision of the key's last change: a bucket record's epoch.
    public let modRevision: Int64
    /// How many times the key was written since it was created.
    public let version: Int64
    /// The lease the key is bound to (0: none).
    public let lease: Int64

    /// The value as UTF-8 text.
    public var text: String { String(decoding: value, as: UTF8.self) }
}

/// A lease: keys bound to it are deleted when it ends (``EtcdClient/keepAlive(_:)`` renews it).
public struct EtcdLease: Sendable, Equatable {
    public let id: Int64
    public let ttlSeconds: Int
}

/// Why an etcd call failed.
public enum EtcdError: Error, Equatable, CustomStringConvertible {
    /// No member could be reached; nothing was applied.
    case unavailable(String)
    /// A write reached a member but its outcome is unknown (a time-out, no leader): read back.
    case ambiguous(String)
    /// etcd refused the call (its gRPC code and message).
    case server(code: Int, message: String)
    /// A reply userstore does not understand.
    case protocolViolation(String)

    public var description: String {
        switch self {
        case .unavailable(let detail): "etcd unavailable: \(detail)"
        case .ambiguous(let detail): "etcd outcome unknown: \(detail)"
        case .server(let code, let message): "etcd error \(code): \(message)"
        case .protocolViolation(let detail): "unexpected etcd reply: \(detail)"
        }
    }
}
