import Logging
import Synchronization

/// This host's membership of the cluster: an etcd lease, the host record bound to it
/// (`/us/v1/hosts/<host>`), kept alive; and the local deadline after which the host must not
/// acknowledge writes for its buckets, because etcd may have let the lease go and the
/// controller may have given the buckets to another host.
///
/// The deadline is kept on this host's monotonic clock, never compared with another host's:
/// it is the instant *before* the last successful keepalive request was sent, plus the TTL
/// etcd granted, minus ``margin``. etcd can only expire the lease later than that (it counts
/// from when the request reached it; it even extends leases when its leader changes), so a
/// host that was paused, cut off or slowed stops acknowledging before anyone else may start.
public final class HostMembership: Sendable {
    /// The host's name in the cluster (its record's key).
    public let host: String
    /// The host's record: what other hosts need to reach it (JSON).
    public let record: String
    public let ttlSeconds: Int
    /// Taken off every deadline: clock-rate differences and the time a check takes to act.
    public let margin: Duration

    private let etcd: EtcdClient
    private let logger: Logger
    private let state = Mutex<State>(State())

    private struct State {
        var lease: Int64 = 0
        var joinedRevision: Int64 = 0
        var deadline: ContinuousClock.Instant?
        var leaving = false
    }

    /// The prefix of every host record's key.
    public static let prefix = "/us/v1/hosts/"

    /// The key of `host`'s record.
    public static func key(of host: String) -> String { prefix + host }

    public init(etcd: EtcdClient, host: String, record: String, ttlSeconds: Int = 10, margin: Duration = .seconds(1),
                logger: Logger = Logger(label: "userstore.cluster")) {
        precondition(Duration.seconds(ttlSeconds) > margin * 2, "the lease TTL must be well above the margin")
        self.etcd = etcd
        self.host = host
        self.record = record
        self.ttlSeconds = ttlSeconds
        self.margin = margin
        self.logger = logger
    }

    /// Whether this host may acknowledge a write for a bucket it owns now: its lease is
    /// certainly still alive in etcd. Lock-cheap; called on the request path.
    public var mayAcknowledge: Bool {
        state.withLock { $0.deadline.map { ContinuousClock.now < $0 } ?? false }
    }

    /// The instant (this host's monotonic clock) until which the host may acknowledge writes;
    /// nil before it joined or after it left or lost its lease.
    public var deadline: ContinuousClock.Instant? { state.withLock { $0.deadline } }

    /// How long the host may still acknowledge writes (zero when it may not).
    public var remaining: Duration {
        state.withLock { $0.deadline.map { max(.zero, $0 - ContinuousClock.now) } ?? .zero }
    }

    /// The lease the record is bound to (0 before ``join()``).
    public var lease: Int64 { state.withLock { $0.lease } }

    /// The etcd revision at which the host last joined: a copy of the bucket records older than
    /// that may predate moves made while the host was away, and must not be trusted.
    public var joinedRevision: Int64 { state.withLock { $0.joinedRevision } }

    /// Takes a lease and creates the host record bound to it. Throws
    /// ``ClusterError/hostNameTaken(_:)`` when a live host already has the name.
    public func join() async throws {
        let started = ContinuousClock.now
        let lease = try await etcd.grantLease(ttlSeconds: ttlSeconds)
        let result = try await etcd.create(Self.key(of: host), record, lease: lease.id)
        guard result.created else {
            try? await etcd.revokeLease(lease.id)
            throw ClusterError.hostNameTaken(host)
        }
        state.withLock { state in
            state.lease = lease.id
            state.joinedRevision = result.current.createRevision
            state.deadline = started + .seconds(lease.ttlSeconds) - margin
        }
        logger.notice("joined the cluster as \(host)", metadata: ["event": "cluster-joined", "host": .string(host), "lease": "\(lease.id)"])
    }

    /// Keeps the lease alive (every third of the TTL) until ``leave()`` or cancellation. A
    /// lease etcd let go is replaced by a new one (with the record again), then `onRejoin` runs:
    /// the host is back, but its buckets may have moved meanwhile, which only a fresh read of
    /// the owner records says.
    public func keepAlive(onRejoin: @Sendable () async -> Void = {}) async {
        let period = Duration.seconds(ttlSeconds) / 3
        while !Task.isCancelled, !state.withLock({ $0.leaving }) {
            let lease = state.withLock { $0.lease }
            let sent = ContinuousClock.now
            do {
                let ttl = try await etcd.keepAlive(lease)
                if ttl > 0 {
                    state.withLock { $0.deadline = sent + .seconds(ttl) - margin }
                } else {
                    state.withLock { $0.deadline = nil }
                    logger.warning("cluster lease \(lease) expired: joining again", metadata: ["event": "cluster-lease-lost", "host": .string(host)])
                    try await join()
                    await onRejoin()
                }
            } catch {
                // The deadline stands: past it, the host stops acknowledging on its own.
                logger.warning("cluster keepalive failed: \(error)", metadata: ["event": "cluster-unreachable", "host": .string(host), "error": .string("\(error)")])
            }
            try? await Task.sleep(until: sent + period, clock: .continuous) // the keepalive period
        }
    }

    /// Ends the lease (the record goes with it) so the controller can move the host's buckets
    /// at once instead of after the TTL.
    public func leave() async {
        let lease = state.withLock { state -> Int64 in
            state.leaving = true
            state.deadline = nil
            return state.lease
        }
        if lease != 0 { try? await etcd.revokeLease(lease) }
    }
}

/// Cluster errors a daemon reports by name.
public enum ClusterError: Error, Equatable, CustomStringConvertible {
    /// Another live host already has this host's name (its lease has not ended).
    case hostNameTaken(String)

    public var description: String {
        switch self {
        case .hostNameTaken(let host): "HostNameTaken: a live host is already called '\(host)' (its record is /us/v1/hosts/\(host))"
        }
    }
}
