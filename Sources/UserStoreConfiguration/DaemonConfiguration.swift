import Foundation
import UserStoreCore

/// Everything `userstored` is configured with, validated and frozen.
/// See config/userstored.yaml for the file format and docs/configuration.md for each key.
public struct DaemonConfiguration: Sendable {
    /// Recorded in every store this daemon opens or migrates (`appVersion`).
    public var appVersion: AppVersion
    /// Where the stores live (`dataDirectory`).
    public var dataDirectory: String
    /// The Unix socket (`socketPath`), unless systemd passes one.
    public var socketPath: String
    /// Permission bits of a socket the daemon binds itself (`socketMode`, octal string).
    public var socketMode: UInt32
    /// Group that owns a socket the daemon binds itself (`socketGroup`), if any.
    public var socketGroup: String?
    /// The numbered migrations (`migrationsDirectory`).
    public var migrationsDirectory: String
    /// The desired schema reconciled after them (`schemaFile`), if any.
    public var schemaFile: String?
    /// At most this many store files open at once (`maxOpenStores`).
    public var maxOpenStores: Int
    /// Unused stores are closed after this long (`idleTimeoutSeconds`).
    public var idleTimeoutSeconds: Int
    /// An open store unused for this long hands its page cache back (`cacheIdleSeconds`; 0: never).
    public var cacheIdleSeconds = 1
    /// Migration policy (`migrations.*`).
    public var policy: MigrationPolicy
    /// Who may do what (`access.*`).
    public var access: AccessRules
    /// Bounds on every request (`limits.*`).
    public var limits: RequestLimits
    /// Where log events go (`logTarget`).
    public var logTarget: LogTarget
    /// Requests slower than this are logged (`slowRequestMilliseconds`).
    public var slowRequestMilliseconds: Int
    /// Default parallelism of fleet migrations (`fleetParallelism`).
    public var fleetParallelism: Int
    /// `fleetParallelism` when not configured: 16 stores per core, at most 64. A store being
    /// migrated spends much of its time waiting for a sync, and the more stores wait at once,
    /// the more one `syncfs` serves (``MigrationPolicy/FleetSyncMethod/syncfs``): on 2 cores
    /// and a journaled ext4, 16 / 32 / 64 at a time gave 590 / 689 / 646 stores/s (10,000
    /// stores; docs/performance.md).
    public static let defaultFleetParallelism = min(64, 16 * ProcessInfo.processInfo.activeProcessorCount)
    /// The file this was read from.
    public var sourcePath: String
    /// Where Prometheus metrics are served (`metrics.listen`); nil: not served.
    public var metricsListen: MetricsAddress? = nil
    /// The off-host copy of every store (`replication.*`); nil: off.
    public var replication: ReplicationSettings? = nil
    /// More than one host (`cluster.*`); nil: this host serves every user.
    public var cluster: ClusterSettings? = nil
    /// How new releases reach the fleet (`rollout.*`, docs/releases.md); nil: every store
    /// migrates on its next request, as without releases.
    public var rollout: RolloutPolicy? = nil
    /// What stores keep of their committed changes for watchers (`watch.*`, docs/watch.md); nil:
    /// the change stream is off (`watch.enabled: false`).
    public var watch: ChangeRetention? = ChangeRetention()
    /// Per-user encryption at rest (`encryption.*`, docs/encryption.md); nil: stores are plaintext.
    public var encryption: EncryptionSettings? = nil

    /// `auto` follows systemd's rule: the native journal protocol when stderr is connected to
    /// the journal (`$JOURNAL_STREAM`), readable lines on stderr otherwise.
    public enum LogTarget: String, Sendable, CaseIterable {
        case auto, journal, stderr
    }

    /// The registry configuration these settings imply.
    public var registryConfiguration: RegistryConfiguration {
        var configuration = RegistryConfiguration(layout: StoreLayout(dataDirectory: dataDirectory), appVersion: appVersion,
                              maxOpenStores: maxOpenStores, idleTimeout: .seconds(idleTimeoutSeconds), policy: policy)
        configuration.changeRetention = watch
        configuration.cacheIdle = cacheIdleSeconds > 0 ? .seconds(cacheIdleSeconds) : nil
        return configuration
    }
}

/// `encryption.*`: every store encrypted with its user's data key, the data keys wrapped by a
/// key-encryption key in a key store apart from the data (docs/encryption.md).
public struct EncryptionSettings: Sendable, Equatable {
    /// The key-encryption key's file (`encryption.keyFile`): 32 bytes, raw or base64.
    public var keyFile: String?
    /// A systemd credential holding the same (`encryption.credential`; `LoadCredentialEncrypted=NAME:…`),
    /// read from `$CREDENTIALS_DIRECTORY/NAME`; wins over `keyFile`.
    public var credential: String?
    /// Where the wrapped data keys are (`encryption.keyStore`).
    public var keyStore: KeyStoreLocation

    /// `file:///path`, `s3://bucket/prefix` (reached like an `s3://` replica: the URL's
    /// endpoint, region and addressing, `replication.s3.*`'s credentials), or `etcd` (a cluster's).
    public enum KeyStoreLocation: Sendable, Equatable {
        case folder(String)
        case bucket(S3ReplicaSettings)
        /// The cluster's etcd (`cluster.etcd`), under `/us/v1/keys/`.
        case etcd
    }

    public init(keyStore: KeyStoreLocation) {
        self.keyStore = keyStore
    }

    /// The key-encryption key's file as the daemon reads it: the credential's file when one is
    /// named, else `keyFile`.
    public func keyFilePath(credentialsDirectory: String?) -> String? {
        if let credential { return credentialsDirectory.map { $0 + "/" + credential } }
        return keyFile
    }
}

/// `replication.*`: every open store copied off the host by the daemon's own log
/// (docs/replication.md).
public struct ReplicationSettings: Sendable, Equatable {
    /// The URL schemes a replica may use.
    public static let schemes: Set<String> = ["file", "s3"]
    /// Where every store's copy goes (`replication.replica`): each host's log under
    /// `<replica>/log/`, each user's folded objects under `<replica>/users/`.
    public var replica: String
    /// Every Execute, Batch and Commit waits until its transaction is in the replica
    /// (`replication.durableWrites`; a call can ask with `durable: true`).
    public var durableWrites: Bool = false
    /// How long a durable write waits for the replica, from its commit to its reply
    /// (`replication.durableTimeoutMilliseconds`).
    public var durableTimeoutMilliseconds: Int = 10_000
    /// The writer lease's time to live (`replication.leaseSeconds`, one host only: a cluster's
    /// writers are its bucket owners): the holder renews it every third of this and acknowledges
    /// durable writes only within this, less a margin, after its last renewal began; another host
    /// takes the replica over once it has seen the lease unchanged for this long.
    public var leaseSeconds: Int = 15
    /// Log objects older than this are folded into per-user objects and deleted
    /// (`replication.foldSeconds`; 0: as soon as they are stored). Shorter: a smaller log for a
    /// restore to read, more per-user objects written.
    public var foldSeconds: Int = 60
    /// While a log object is being written, the next begins once it is stored or once its oldest
    /// commit has waited this long (`replication.batchMilliseconds`; 0: at once, up to four
    /// objects in flight; 5 measured best, docs/performance.md). Longer: fewer PUTs, a little more
    /// latency.
    public var batchMilliseconds: Int = 5
    /// The litestream binary (`replication.litestream`): reads, once, a user's copy in
    /// Litestream's layout (from before the daemon's own log).
    public var litestream: String = "litestream"
    /// The keys of Litestream's time present in the file (`replication.engine`,
    /// `syncIntervalMilliseconds`, …): accepted, unused, named once at start.
    public var unusedKeys: [String] = []

    /// With an `s3://` replica: where its bucket is served and how to sign in (`replication.s3.*`,
    /// merged with the replica URL's own `endpoint`, `region` and `forcePathStyle`).
    public var s3: S3ReplicaSettings?

    public init(replica: String) {
        self.replica = replica
    }
}

/// `replication.s3.*`: an `s3://` replica's endpoint and credentials (docs/replication.md,
/// "Running on S3").
public struct S3ReplicaSettings: Sendable, Equatable {
    /// The bucket, from `s3://BUCKET/prefix`.
    public var bucket: String
    /// The key prefix every user's folder goes under (no leading or trailing `/`; may be empty).
    public var prefix: String
    /// `http(s)://host[:port]` of an S3-compatible server; nil: AWS's endpoint for the region.
    public var endpoint: String?
    public var region: String = "us-east-1"
    /// Path-style addressing (`host/bucket/key`): true with an `endpoint` unless set, false for AWS.
    public var forcePathStyle: Bool = false
    /// An AWS shared-credentials file (or `NAME=value` lines) with the access key.
    public var credentialsFile: String?
    /// A systemd credential (`LoadCredential=NAME:…`) holding the same, read from
    /// `$CREDENTIALS_DIRECTORY/NAME`.
    public var credential: String?
    /// PEM file of the CAs that sign a TLS endpoint (nil: the system's).
    public var caFile: String?

    public init(bucket: String, prefix: String) {
        self.bucket = bucket
        self.prefix = prefix
    }

    /// The replica URL as Litestream and outside tools take it: `s3://BUCKET/PREFIX` with the
    /// endpoint, region and addressing style in its query.
    public var url: String {
        var query = ["region=\(region)"]
        if let endpoint { query.insert("endpoint=\(endpoint)", at: 0) }
        query.append("forcePathStyle=\(forcePathStyle)")
        return "s3://\(bucket)" + (prefix.isEmpty ? "" : "/" + prefix) + "?" + query.joined(separator: "&")
    }
}

/// Bounds on what one request may cost.
public struct RequestLimits: Sendable, Equatable {
    /// Largest request message, in bytes (`limits.maxRequestBytes`).
    public var maxRequestBytes: Int = 16 << 20
    /// Largest reply, in bytes (`limits.maxResponseBytes`).
    public var maxResponseBytes: Int = 64 << 20
    /// A client statement is interrupted after this long (`limits.statementTimeoutMilliseconds`).
    public var statementTimeoutMilliseconds: Int = 5_000
    /// Most statements in one Batch (`limits.maxBatchStatements`).
    public var maxBatchStatements: Int = 10_000
    /// Most concurrent connections (`limits.maxConnections`).
    public var maxConnections: Int = 1_024
    /// Deepest JSON nesting accepted (`limits.maxJSONDepth`).
    public var maxJSONDepth: Int = 64
    /// An interactive transaction with no call for this long is rolled back
    /// (`limits.transactionIdleMilliseconds`).
    public var transactionIdleMilliseconds: Int = 5_000
    /// An interactive transaction open this long is rolled back (`limits.transactionMilliseconds`).
    public var transactionMilliseconds: Int = 30_000
    /// A connection that sent part of a message and nothing more for this long is closed
    /// (`limits.requestReadSeconds`).
    public var requestReadSeconds: Int = 30
    /// A connection with nothing to do for this long is closed (`limits.idleConnectionSeconds`).
    public var idleConnectionSeconds: Int = 3_600
    /// Most concurrent connections of one Unix user (`limits.maxConnectionsPerUser`).
    public var maxConnectionsPerUser: Int = 512
    /// A watcher whose unsent changes pass this many bytes is dropped with `WatchTooSlow`
    /// (`watch.maxBufferedBytes`).
    public var watchMaxBufferedBytes: Int = 8 << 20

    public init() {}
}

/// Where `GET /metrics` is served: `host:port` (TCP; `[::1]:9464` for IPv6) or
/// `unix:/absolute/path` (a Unix socket, which needs no network in the hardened unit).
public enum MetricsAddress: Sendable, Equatable, CustomStringConvertible {
    case tcp(host: String, port: Int)
    case unix(path: String)

    public init?(_ text: String) {
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst(5))
            guard path.hasPrefix("/") else { return nil }
            self = .unix(path: path)
            return
        }
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (1...65535).contains(port) else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self = .tcp(host: host, port: port)
    }

    public var description: String {
        switch self {
        case .tcp(let host, let port): return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix(let path): return "unix:\(path)"
        }
    }
}

/// `cluster.*`: more than one host, users placed by bucket through etcd (docs/cluster.md).
public struct ClusterSettings: Sendable, Equatable {
    /// This host's name in the cluster (`cluster.host`): letters, digits, `.`, `_`, `-`.
    public var host: String
    /// The etcd members' client URLs (`cluster.etcd`), e.g. `http://127.0.0.1:2379`.
    public var etcd: [String]
    /// Where other daemons reach this one (`cluster.address`, `host:port`); `WrongHost` names it.
    public var address: String
    /// The host lease's TTL (`cluster.leaseSeconds`, 3–300, default 10): a host that cannot
    /// renew it stops acknowledging writes within this time, and its buckets move after it.
    public var leaseSeconds: Int = 10
    /// Whether `io.userstore.Store` calls for users another host owns are forwarded to it
    /// (`cluster.forward`, default true; needs `cluster.tls`); false: they get `WrongHost`.
    public var forward: Bool = true
    /// Where this daemon listens for other daemons (`cluster.listen`, `host:port`; default
    /// `cluster.address`). Only with `cluster.tls`.
    public var listen: String
    /// A forwarded call unanswered this long ends its link to the owner
    /// (`cluster.forwardTimeoutMilliseconds`, default 30000): `HostUnreachable`.
    public var forwardTimeoutMilliseconds: Int = 30_000
    /// Mutual TLS between daemons (`cluster.tls.*`); nil: no listener, no forwarding.
    public var tls: ClusterTLS?

    public init(host: String, etcd: [String], address: String) {
        self.host = host
        self.etcd = etcd
        self.address = address
        self.listen = address
    }
}

/// `cluster.tls.*`: PEM files for mutual TLS between daemons. Every daemon presents its
/// certificate (`certificate`, `key`) and accepts only peers whose certificate the cluster's
/// CA (`ca`) signed.
public struct ClusterTLS: Sendable, Equatable {
    /// This host's certificate chain (`cluster.tls.certificate`), PEM.
    public var certificate: String
    /// Its private key (`cluster.tls.key`), PEM.
    public var key: String
    /// The CA certificates a peer's certificate must chain to (`cluster.tls.ca`), PEM.
    public var ca: String

    public init(certificate: String, key: String, ca: String) {
        self.certificate = certificate
        self.key = key
        self.ca = ca
    }
}

/// A `host:port` address split in two (IPv6 hosts in brackets: `[::1]:7001`).
public struct HostPort: Sendable, Equatable {
    public var host: String
    public var port: Int

    /// Nil when `text` is not `host:port` with a port in 1–65535.
    public init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (1...65535).contains(port) else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self.host = host
        self.port = port
    }
}
