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
        let reply = try await call("/v3/kv/range", ["key": Self.base64(key)], idempotent: true)
        return try Self.keyValues(reply["kvs"]).first
    }

    /// Every key that starts with `prefix`, in key order.
    public func list(prefix: String) async throws(EtcdError) -> [EtcdKeyValue] {
        let reply = try await call("/v3/kv/range", ["key": Self.base64(prefix), "range_end": Self.base64(Self.rangeEnd(of: prefix))], idempotent: true)
        return try Self.keyValues(reply["kvs"])
    }

    /// Every key under `prefix` and the store revision they were read at (a watch from the
    /// next revision misses nothing).
    public func snapshot(prefix: String) async throws(EtcdError) -> (keys: [EtcdKeyValue], revision: Int64) {
        let reply = try await call("/v3/kv/range", ["key": Self.base64(prefix), "range_end": Self.base64(Self.rangeEnd(of: prefix))], idempotent: true)
        return (try Self.keyValues(reply["kvs"]), try Self.revision(reply))
    }

    /// The changes to keys under `prefix` from store revision `revision` on, in order, as
    /// etcd's watch delivers them (one element per reply). The stream ends with an error when
    /// the member goes away or the revision was compacted; the caller takes a new
    /// ``snapshot(prefix:)`` and watches again.
    public func watch(prefix: String, fromRevision revision: Int64) -> AsyncThrowingStream<[EtcdEvent], any Error> {
        let body = (try? JSONSerialization.data(withJSONObject: ["create_request": [
            "key": Self.base64(prefix), "range_end": Self.base64(Self.rangeEnd(of: prefix)), "start_revision": String(revision),
        ]])) ?? Data()
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
        guard let reply = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any] else {
            throw .protocolViolation("a watch reply that is not JSON")
        }
        guard let result = reply["result"] as? [String: Any] else {
            throw .server(code: Int(int(reply["code"])), message: reply["message"] as? String ?? "watch failed: \(reply)")
        }
        if result["canceled"] as? Bool == true {
            throw .server(code: 0, message: "watch cancelled: \(result["cancel_reason"] as? String ?? "") (compacted to \(int(result["compact_revision"])))")
        }
        return try (result["events"] as? [[String: Any]] ?? []).map { event throws(EtcdError) in
            guard let kv = try keyValues([event["kv"] as Any]).first else { throw .protocolViolation("a watch event without its key") }
            return EtcdEvent(deleted: event["type"] as? String == "DELETE", keyValue: kv)
        }
    }

    /// Sets `key` (bound to `lease` if given: deleted when the lease ends); returns the store's
    /// revision after the put (the key's new `modRevision`).
    @discardableResult
    public func put(_ key: String, _ value: String, lease: Int64? = nil) async throws(EtcdError) -> Int64 {
        var body: [String: Any] = ["key": Self.base64(key), "value": Self.base64(value)]
        if let lease { body["lease"] = String(lease) }
        let reply = try await call("/v3/kv/put", body, idempotent: false)
        return try Self.revision(reply)
    }

    /// Deletes `key`; returns whether it existed.
    @discardableResult
    public func delete(_ key: String) async throws(EtcdError) -> Bool {
        let reply = try await call("/v3/kv/deleterange", ["key": Self.base64(key)], idempotent: false)
        return Self.int(reply["deleted"]) > 0
    }

    /// Creates `key` only if it does not exist (one transaction: `create_revision == 0`).
    /// Returns whether this call created it, and the key as it is now (the winner's value
    /// when another caller created it first).
    public func create(_ key: String, _ value: String, lease: Int64? = nil) async throws(EtcdError) -> (created: Bool, current: EtcdKeyValue) {
        var put: [String: Any] = ["key": Self.base64(key), "value": Self.base64(value)]
        if let lease { put["lease"] = String(lease) }
        let reply = try await call("/v3/kv/txn", [
            "compare": [["key": Self.base64(key), "target": "CREATE", "create_revision": "0"]],
            "success": [["request_put": put]],
            "failure": [["request_range": ["key": Self.base64(key)]]],
        ], idempotent: false)
        if reply["succeeded"] as? Bool == true {
            let revision = try Self.revision(reply)
            return (true, EtcdKeyValue(key: key, value: Array(value.utf8), createRevision: revision, modRevision: revision, version: 1, lease: lease ?? 0))
        }
        guard let range = (reply["responses"] as? [[String: Any]])?.first?["response_range"] as? [String: Any],
              let current = try Self.keyValues(range["kvs"]).first else {
            // Created and deleted again between the compare and the read: a race to retry.
            throw .ambiguous("\(key) existed at the compare and not at the read")
        }
        return (false, current)
    }

    /// Sets `key` to `value` only if its `modRevision` is still `expected` (0: only if absent).
    /// Returns the new `modRevision` (the key's next epoch), or nil when somebody changed the
    /// key first.
    public func swap(_ key: String, expectedModRevision expected: Int64, to value: String) async throws(EtcdError) -> Int64? {
        let compare: [String: Any] = expected == 0
            ? ["key": Self.base64(key), "target": "CREATE", "create_revision": "0"]
            : ["key": Self.base64(key), "target": "MOD", "mod_revision": String(expected)]
        let reply = try await call("/v3/kv/txn", [
            "compare": [compare],
            "success": [["request_put": ["key": Self.base64(key), "value": Self.base64(value)]]],
        ], idempotent: false)
        guard reply["succeeded"] as? Bool == true else { return nil }
        return try Self.revision(reply)
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
        var compares: [[String: Any]] = changes.map { change in
            change.expectedModRevision == 0
                ? ["key": Self.base64(change.key), "target": "CREATE", "create_revision": "0"]
                : ["key": Self.base64(change.key), "target": "MOD", "mod_revision": String(change.expectedModRevision)]
        }
        if let guardKey {
            compares.append(["key": Self.base64(guardKey.key), "target": "LEASE", "lease": String(guardKey.lease)])
        }
        let reply = try await call("/v3/kv/txn", [
            "compare": compares,
            "success": changes.map { ["request_put": ["key": Self.base64($0.key), "value": Self.base64($0.value)]] },
        ], idempotent: false)
        guard reply["succeeded"] as? Bool == true else { return nil }
        return try Self.revision(reply)
    }

    /// Writes every key of `puts` and deletes every key of `deletes` in one transaction (at most
    /// 128 operations); returns the new revision.
    @discardableResult
    public func write(puts: [(key: String, value: String)] = [], deletes: [String] = []) async throws(EtcdError) -> Int64 {
        precondition(puts.count + deletes.count <= 128, "etcd takes at most 128 operations per transaction")
        let operations: [[String: Any]] = puts.map { ["request_put": ["key": Self.base64($0.key), "value": Self.base64($0.value)]] }
            + deletes.map { ["request_delete_range": ["key": Self.base64($0)]] }
        let reply = try await call("/v3/kv/txn", ["success": operations], idempotent: false)
        return try Self.revision(reply)
    }

    // MARK: Leases

    /// A new lease of `ttlSeconds`; keys bound to it go when it ends.
    public func grantLease(ttlSeconds: Int) async throws(EtcdError) -> EtcdLease {
        let reply = try await call("/v3/lease/grant", ["TTL": String(ttlSeconds)], idempotent: false)
        let id = Self.int(reply["ID"])
        guard id != 0 else { throw .protocolViolation("lease/grant answered without an ID: \(reply)") }
        return EtcdLease(id: id, ttlSeconds: Int(Self.int(reply["TTL"])))
    }

    /// Renews `lease`; returns the TTL it has again, 0 when it has already ended.
    public func keepAlive(_ lease: Int64) async throws(EtcdError) -> Int {
        let reply = try await call("/v3/lease/keepalive", ["ID": String(lease)], idempotent: true)
        guard let result = reply["result"] as? [String: Any] else {
            throw .protocolViolation("lease/keepalive answered without a result: \(reply)")
        }
        return Int(Self.int(result["TTL"]))
    }

    /// Ends `lease` now, deleting its keys (a lease already gone is not an error).
    public func revokeLease(_ lease: Int64) async throws(EtcdError) {
        do {
            _ = try await call("/v3/lease/revoke", ["ID": String(lease)], idempotent: true)
        } catch .server(_, let message) where message.contains("lease not found") {
            return
        }
    }

    // MARK: Transport

    private func call(_ route: String, _ body: [String: Any], idempotent: Bool) async throws(EtcdError) -> [String: Any] {
        let data: Data
        do { data = try JSONSerialization.data(withJSONObject: body) } catch { throw .protocolViolation("encoding \(route): \(error)") }
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
            let reply = (try? JSONSerialization.jsonObject(with: Data(bytes.readableBytesView))) as? [String: Any]
            if status == .ok, let reply {
                preferred.withLock { $0 = index }
                return reply
            }
            let code = Int(Self.int(reply?["code"]))
            let message = reply?["message"] as? String ?? reply?["error"] as? String ?? String(buffer: bytes)
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

    /// The gateway writes 64-bit integers as strings (and leaves zeros out).
    static func int(_ value: Any?) -> Int64 {
        if let text = value as? String { return Int64(text) ?? 0 }
        if let number = value as? NSNumber { return number.int64Value }
        return 0
    }

    private static func revision(_ reply: [String: Any]) throws(EtcdError) -> Int64 {
        let revision = int((reply["header"] as? [String: Any])?["revision"])
        guard revision > 0 else { throw .protocolViolation("reply without a revision: \(reply)") }
        return revision
    }

    private static func keyValues(_ value: Any?) throws(EtcdError) -> [EtcdKeyValue] {
        guard let list = value as? [[String: Any]] else { return [] }
        return try list.map { item throws(EtcdError) in
            guard let key = (item["key"] as? String).flatMap({ Data(base64Encoded: $0) }) else {
                throw .protocolViolation("a key that is not base64: \(item)")
            }
            let value = (item["value"] as? String).flatMap { Data(base64Encoded: $0) } ?? Data()
            return EtcdKeyValue(key: String(decoding: key, as: UTF8.self), value: [UInt8](value),
                                createRevision: int(item["create_revision"]), modRevision: int(item["mod_revision"]),
                                version: int(item["version"]), lease: int(item["lease"]))
        }
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
