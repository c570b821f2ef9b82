import Logging
import Synchronization
import UserStoreClusterServing
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import UserStoreReplication
import Varlink

/// Sends one encoded reply (a NUL-terminated message) to the caller.
typealias ReplySink = @Sendable ([UInt8]) async throws -> Void

/// Who is calling, from `SO_PEERCRED`, and what the access rules grant them.
public struct PeerIdentity: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    public var grant: AccessRules.Grant
    /// Set on a connection from another daemon of the cluster (its address): the calls it
    /// forwards are served here and never forwarded again.
    public var forwardedFrom: String? = nil

    /// Whether the access rules let this peer call `method` (its interface's grant).
    func mayCall(_ method: Method) -> Bool {
        switch method.interface {
        case .service: true
        case .store: grant.store
        case .admin: grant.admin
        }
    }

    /// Another daemon, authenticated by mutual TLS: `io.userstore.Store` only (its own client
    /// passed that daemon's access rules), and not counted against any Unix user's connections.
    static func forwarded(from peer: String) -> PeerIdentity {
        PeerIdentity(uid: UInt32.max, gid: UInt32.max, pid: 0, grant: AccessRules.Grant(store: true, admin: false, onlyStore: nil), forwardedFrom: peer)
    }
}

/// The settings a reload may change while the daemon runs.
struct RuntimeSettings: Sendable {
    var access: AccessRules
    var limits: RequestLimits
    var slowRequestMilliseconds: Int
}

/// What every request handler shares: the registry, the fleet index, the settings.
final class DaemonContext: Sendable {
    let configuration: DaemonConfiguration
    let registry: StoreRegistry
    let index: FleetIndex
    let started: ContinuousClock.Instant
    let logger: Logger
    let notifier = SystemdNotifier()
    /// The open client connections.
    let connections = ConnectionTracker()
    /// Metrics, when they are served (`metrics.listen`).
    let metrics: DaemonMetrics?
    let settings: Mutex<RuntimeSettings>
    let counters = Mutex(Counters())
    /// Replication, when it is on (`replication.*`).
    let replicator: LogReplicator?
    /// This daemon's part in a cluster (`cluster.*`); nil: one host.
    let cluster: DaemonCluster?
    /// The release in force and its staging (docs/releases.md).
    let release: ReleaseTracker

    /// Graceful shutdown has begun: new calls get `ShuttingDown` (read on every request).
    private let shuttingDown = Atomic<Bool>(false)

    var isShuttingDown: Bool { shuttingDown.load(ordering: .relaxed) }

    func beginShutdown() { shuttingDown.store(true, ordering: .relaxed) }

    /// The stores this host serves (``FleetIndex/servedSnapshot()``), once the index has read
    /// every file.
    func servedStores() async -> [(UserID, FleetIndex.Entry)] {
        await index.waitForScan()
        return index.servedSnapshot()
    }

    /// ``FleetIndex/counts(latest:)`` at the migrations loaded now.
    func storeCounts() -> (served: [FleetIndex.State: Int], otherHosts: Int) {
        index.counts(latest: registry.migrations.latestVersion)
    }

    struct Counters {
        var fleetMigrationsInFlight = 0
        /// Progress of the fleet migration running now, for STATUS= and the journal.
        var fleet: FleetRun?
    }

    /// A fleet migration under way.
    struct FleetRun {
        var total: Int
        var done = 0
        var failures = 0
        let started = ContinuousClock.now

        /// Stores per second so far.
        var rate: Double {
            let seconds = (ContinuousClock.now - started).inSeconds
            return seconds > 0 ? Double(done) / seconds : 0
        }
    }

    struct ReloadOutcome: Sendable {
        var migrations: Int
        var latestVersion: Int64
        var generation: Int
    }

    init(configuration: DaemonConfiguration, registry: StoreRegistry, index: FleetIndex, release: ReleaseTracker, logger: Logger,
         metrics: DaemonMetrics? = nil, replicator: LogReplicator? = nil, cluster: DaemonCluster? = nil) {
        self.release = release
        self.metrics = metrics
        self.cluster = cluster
        self.replicator = replicator
        self.configuration = configuration
        self.registry = registry
        self.index = index
        self.started = .now
        self.logger = logger
        self.settings = Mutex(RuntimeSettings(access: configuration.access, limits: configuration.limits,
                                              slowRequestMilliseconds: configuration.slowRequestMilliseconds))
    }

    var limits: RequestLimits { settings.withLock { $0.limits } }
}

extension DaemonContext {
    /// Journals a watcher dropped for falling behind (the only watch event the journal gets).
    func logWatchDropped(user: String, position: Int64, maxBufferedBytes: Int) {
        logger.warning("watcher too slow, dropped", metadata: [
            "event": "watch-dropped", "user": .string(user), "position": .stringConvertible(position),
            "max_buffered_bytes": .stringConvertible(maxBufferedBytes),
        ])
    }

    /// Logs a request slower than `slowRequestMilliseconds`. The method name and user are
    /// logged; SQL and parameters are users' data and are not.
    func logIfSlow(method: String, user: String, elapsed: Duration) {
        let slow = settings.withLock { $0.slowRequestMilliseconds }
        guard elapsed > .milliseconds(slow) else { return }
        logger.warning("slow request", metadata: [
            "event": "slow-request", "method": .string(method), "user": .string(user),
            "duration_usec": .stringConvertible(elapsed.wholeMicroseconds),
        ])
    }
}
