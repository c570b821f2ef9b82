import CoreMetrics
import Foundation
import Metrics
import Prometheus
import Synchronization
import UserStoreCore
import UserStoreInterface
import UserStoreReplication
import UserStoreS3

/// The daemon's metrics: recorded through swift-metrics types (`Counter`, `Timer`, `Meter`,
/// `FloatingPointCounter`), backed by swift-prometheus collectors registered with their help
/// text, exported in the Prometheus text format by ``MetricsServer``. No label carries a user ID
/// (cardinality); docs/metrics.md lists every metric.
///
/// The request path records through handles made once (``requestHandles(method:)``): a counter
/// increment and a histogram observation per call, no lookup. That histogram,
/// `userstore_request_duration_seconds`, is a ``DurationHistogram`` (kept per thread, so the
/// event loops never wait on each other's lock) and is appended to the registry's text.
final class DaemonMetrics: StoreObserver, Sendable {
    let registry = PrometheusCollectorRegistry()
    /// The last seconds, for `Top`.
    let activity = Activity()

    /// Upper bounds of the request duration histogram: 25 µs … 5 s.
    static let requestBuckets: [Duration] = [.microseconds(25), .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500),
                                             .milliseconds(1), .milliseconds(2.5), .milliseconds(5), .milliseconds(10), .milliseconds(25),
                                             .milliseconds(100), .milliseconds(500), .seconds(1), .seconds(5)]
    static let migrationBuckets: [Duration] = [.milliseconds(1), .milliseconds(5), .milliseconds(10), .milliseconds(50), .milliseconds(100),
                                               .milliseconds(500), .seconds(1), .seconds(5), .seconds(30), .seconds(120)]

    // MARK: Requests

    /// The counter and timer of one method; `ok` is pre-made, error outcomes are made on first use.
    final class RequestHandles: Sendable {
        let method: String
        let interface: String
        let ok: CoreMetrics.Counter
        let duration: DurationHistogram
        private let errors = Mutex<[String: CoreMetrics.Counter]>([:])
        private let registry: PrometheusCollectorRegistry
        private let activity: Activity

        init(method: String, registry: PrometheusCollectorRegistry, activity: Activity) {
            self.method = method
            self.registry = registry
            self.activity = activity
            interface = method.split(separator: ".").dropLast().joined(separator: ".")
            ok = DaemonMetrics.counter(registry, "userstore_requests_total", [("interface", interface), ("method", method), ("outcome", "ok")])
            duration = DurationHistogram(labels: [("method", method)], buckets: DaemonMetrics.requestBuckets)
        }

        /// Records one call for `user` that ended with `outcome` (nil: ok) after `nanoseconds`,
        /// replying `bytes`.
        func record(outcome: String?, nanoseconds: UInt64, user: String? = nil, bytes: Int = 0) {
            duration.record(nanoseconds: Int64(truncatingIfNeeded: nanoseconds))
            activity.record(method: method, user: user, nanoseconds: nanoseconds, bytes: bytes)
            guard let outcome else { return ok.increment() }
            let counter = errors.withLock { errors in
                if let counter = errors[outcome] { return counter }
                let counter = DaemonMetrics.counter(registry, "userstore_requests_total", [("interface", interface), ("method", method), ("outcome", outcome)])
                errors[outcome] = counter
                return counter
            }
            counter.increment()
        }
    }

    private let handles = Mutex<[Method: RequestHandles]>([:])
    /// Calls of a method the daemon does not have (and messages that are not calls).
    private let other: RequestHandles

    /// The handles of `method` (nil: one the daemon does not have, counted as `other`).
    func requestHandles(method: Method?) -> RequestHandles {
        guard let method else { return other }
        switch method {
        case .open: return open
        case .query: return query
        case .execute: return execute
        case .batch: return batch
        default: break
        }
        return handles.withLock { handles in
            if let made = handles[method] { return made }
            let made = RequestHandles(method: method.rawValue, registry: registry, activity: activity)
            handles[method] = made
            return made
        }
    }

    /// Pre-made handles of the fast path's methods.
    let open: RequestHandles, query: RequestHandles, execute: RequestHandles, batch: RequestHandles

    /// Every method's handles made so far, by method name.
    private var allHandles: [RequestHandles] {
        ([open, query, execute, batch, other] + handles.withLock { Array($0.values) }).sorted { $0.method < $1.method }
    }

    /// The request duration histogram's lines, after the registry's (it is not one of the
    /// registry's collectors: see ``DurationHistogram``).
    private func emitRequestDurations() -> [UInt8] {
        let name = "userstore_request_duration_seconds"
        var text = "# HELP \(name) \(Self.help[name]!)\n# TYPE \(name) histogram\n"
        for handles in allHandles { handles.duration.emit(name: name, into: &text) }
        return Array(text.utf8)
    }

    private static let errorPrefix = Array("{\"error\":\"".utf8)

    /// The outcome of an encoded reply: nil when it succeeded, else the error's short name.
    static func outcome(of reply: ArraySlice<UInt8>) -> String? {
        guard reply.count > errorPrefix.count, reply.starts(with: errorPrefix) else { return nil }
        let start = reply.startIndex + errorPrefix.count
        guard let end = reply[start...].firstIndex(of: UInt8(ascii: "\"")) else { return "unknown" }
        let name = reply[start..<end]
        let short = name.lastIndex(of: UInt8(ascii: ".")).map { name[($0 + 1)...] } ?? name
        return String(decoding: short, as: UTF8.self)
    }

    // MARK: Stores, migrations, backups, transactions

    private let storeOpens: [String: CoreMetrics.Counter]
    private let evictions: CoreMetrics.Counter
    private let migrationsOK: CoreMetrics.Counter
    private let migrationsFailed: CoreMetrics.Counter
    private let migrationDuration: CoreMetrics.Timer
    /// Each write of a log object, from its first try until it was stored.
    let replicationSyncDuration: CoreMetrics.Timer
    private let backups: CoreMetrics.Counter
    private let backupBytes: CoreMetrics.Counter
    private let transactions: [String: CoreMetrics.Counter]
    let transactionsOpen = Atomic<Int>(0)
    private let watchersOpen = Atomic<Int>(0)
    private let watchesDropped: CoreMetrics.Counter
    private let watchEvents: CoreMetrics.Counter

    // Read when scraped.
    private let gauges: [String: CoreMetrics.Meter]
    private let cpuSeconds: CoreMetrics.FloatingPointCounter
    private let cpuRecorded = Mutex<Double>(0)
    /// What of the S3 client's totals the bucket counters hold.
    private let bucketCounted = Mutex(S3Client.Traffic())

    /// The daemon's metrics, and swift-metrics' global factory pointed at the same registry (so
    /// whatever else records through swift-metrics is exported too). Once per process.
    static func bootstrap() -> DaemonMetrics {
        let metrics = DaemonMetrics()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: metrics.registry))
        return metrics
    }

    private init() {
        let registry = self.registry
        func gauge(_ name: String, _ labels: [(String, String)] = []) -> CoreMetrics.Meter {
            CoreMetrics.Meter(label: name, dimensions: labels, handler: registry.makeGauge(descriptor: Self.descriptor(name), labels: labels))
        }
        open = RequestHandles(method: Method.open.rawValue, registry: registry, activity: activity)
        query = RequestHandles(method: Method.query.rawValue, registry: registry, activity: activity)
        execute = RequestHandles(method: Method.execute.rawValue, registry: registry, activity: activity)
        batch = RequestHandles(method: Method.batch.rawValue, registry: registry, activity: activity)
        other = RequestHandles(method: "other", registry: registry, activity: activity)
        storeOpens = Dictionary(uniqueKeysWithValues: ["created", "reopened", "from_template", "restored"].map { kind in
            (kind, Self.counter(registry, "userstore_store_opens_total", [("kind", kind)]))
        })
        evictions = Self.counter(registry, "userstore_store_evictions_total")
        migrationsOK = Self.counter(registry, "userstore_migrations_total", [("outcome", "ok")])
        migrationsFailed = Self.counter(registry, "userstore_migrations_total", [("outcome", "failed")])
        migrationDuration = CoreMetrics.Timer(label: "userstore_migration_duration_seconds", dimensions: [],
                                              handler: registry.makeDurationHistogram(descriptor: Self.descriptor("userstore_migration_duration_seconds"), buckets: Self.migrationBuckets))
        replicationSyncDuration = CoreMetrics.Timer(label: "userstore_replication_sync_duration_seconds", dimensions: [],
                                                    handler: registry.makeDurationHistogram(descriptor: Self.descriptor("userstore_replication_sync_duration_seconds"), buckets: Self.migrationBuckets))
        backups = Self.counter(registry, "userstore_backups_total")
        backupBytes = Self.counter(registry, "userstore_backup_bytes_total")
        transactions = Dictionary(uniqueKeysWithValues: ["committed", "rolled_back", "expired", "aborted"].map { outcome in
            (outcome, Self.counter(registry, "userstore_transactions_total", [("outcome", outcome)]))
        })
        watchesDropped = Self.counter(registry, "userstore_watchers_dropped_total")
        watchEvents = Self.counter(registry, "userstore_watch_events_total")
        var gauges: [String: CoreMetrics.Meter] = [
            "connections": gauge("userstore_connections"),
            "open": gauge("userstore_open_stores"),
            "known": gauge("userstore_known_stores"),
            "transactions": gauge("userstore_transactions_open"),
            "watchers": gauge("userstore_watchers"),
            "rss": gauge("process_resident_memory_bytes"),
            "fds": gauge("process_open_fds"),
            "start": gauge("process_start_time_seconds"),
            "replication.degraded": gauge("userstore_replication_degraded"),
            "replication.registered": gauge("userstore_replication_stores", [("state", "registered")]),
            "replication.unregistered": gauge("userstore_replication_stores", [("state", "unregistered")]),
            "replication.lag": gauge("userstore_replication_max_lag_seconds"),
            "replication.pass": gauge("userstore_replication_sync_pass_seconds"),
            "replication.diverged": gauge("userstore_replication_diverged_replicas"),
            "replication.syncs": gauge("userstore_replication_syncs"),
            "replication.shared": gauge("userstore_replication_shared_sync_waits"),
            "replication.verified": gauge("userstore_replication_replica_verified"),
            "replication.lease": gauge("userstore_replication_lease_held"),
            "replication.epoch": gauge("userstore_replication_lease_epoch"),
            "replication.log.tail": gauge("userstore_replication_log_tail_objects"),
            "replication.log.oldest": gauge("userstore_replication_log_oldest_unstored_seconds"),
            "replication.log.pending": gauge("userstore_replication_log_pending_bytes"),
            "replication.log.written": gauge("userstore_replication_log_objects_written"),
            "replication.log.folded": gauge("userstore_replication_log_objects_folded"),
        ]
        for state in ["current", "pending", "failed", "too_new"] {
            gauges["stores." + state] = gauge("userstore_stores", [("state", state)])
        }
        for state in ["encrypted", "plaintext"] {
            gauges["encryption." + state] = gauge("userstore_stores_encryption", [("state", state)])
        }
        for state in ["done", "failed", "total"] {
            gauges["fleet." + state] = gauge("userstore_fleet_migration_stores", [("state", state)])
        }
        gauges["release.step"] = gauge("userstore_release_step_percent")
        gauges["release.failed"] = gauge("userstore_release_failed_stores")
        gauges["release.ratio"] = gauge("userstore_release_failure_ratio")
        for state in Release.State.allCases {
            gauges["release." + state.rawValue] = gauge("userstore_release_state", [("state", state.rawValue)])
        }
        self.gauges = gauges
        cpuSeconds = CoreMetrics.FloatingPointCounter(label: "process_cpu_seconds_total", dimensions: [],
                                                      handler: registry.makeCounter(descriptor: Self.descriptor("process_cpu_seconds_total")))
        gauges["start"]?.set(Date().timeIntervalSince1970)
    }

    /// Every metric's help text (one per name: the registry requires them identical across series).
    static let help: [String: String] = [
        "userstore_requests_total": "Calls answered, by interface, method and outcome (ok or the error's short name).",
        "process_cpu_seconds_total": "Total user and system CPU time spent in seconds.",
        "process_open_fds": "Number of open file descriptors.",
        "process_resident_memory_bytes": "Resident memory size in bytes.",
        "process_start_time_seconds": "Start time of the process since the Unix epoch, in seconds.",
        "userstore_backup_bytes_total": "Bytes of the copies of stores taken.",
        "userstore_backups_total": "Copies of stores taken (before migrations, manual, before restores and imports).",
        "userstore_connections": "Open client connections.",
        "userstore_fleet_migration_stores": "The fleet migration running now: stores done, failed, and in all (0 when none runs).",
        "userstore_known_stores": "Stores in the data directory (the fleet index).",
        "userstore_release_step_percent": "The current step of the release in force, in percent of users (100 when it is not staged).",
        "userstore_release_failed_stores": "Stores whose migration failed in the release in force.",
        "userstore_release_failure_ratio": "Failed stores of the release over the known stores its current step reaches (it halts past haltOn).",
        "userstore_release_state": "1 for the state the release in force is in (none, running, halted, complete, aborted), 0 for the others.",
        "userstore_migration_duration_seconds": "Duration of a store's migration run (every step of it).",
        "userstore_migrations_total": "Migration runs of a store, by outcome.",
        "userstore_open_stores": "Store files open now (maxOpenStores bounds them).",
        "userstore_replication_degraded": "1 while replication is degraded (the log cannot be written, the replica unreachable, missing or another one, the writer lease held elsewhere, or open stores without a base in the log), else 0 (also when replication is off).",
        "userstore_replication_stores": "Open stores by replication state: registered (their base is in the log), or unregistered (served; durable writes fail until the base is stored).",
        "userstore_replication_max_lag_seconds": "How long the oldest commit the host log has not stored yet has waited (the same as userstore_replication_log_oldest_unstored_seconds; kept for dashboards from Litestream's time).",
        "userstore_replication_sync_pass_seconds": "0: kept for dashboards from Litestream's time (retired; the log has no sync passes).",
        "userstore_replication_diverged_replicas": "0: kept for dashboards from Litestream's time (retired).",
        "userstore_replication_syncs": "Log objects written since the daemon started (each ships what every store committed since the one before).",
        "userstore_replication_sync_duration_seconds": "How long each write of a log object took, from its first try until it was stored; what a durable write waits for.",
        "userstore_replication_bucket_requests_total": "Requests the daemon sent to the bucket, by S3 operation (PUT, GET, HEAD, DELETE, LIST), as its S3 client counted them.",
        "userstore_replication_bucket_bytes_total": "Bytes sent to (PUT) and read from (GET) the bucket, counted like userstore_replication_bucket_requests_total.",
        "userstore_replication_log_tail_objects": "Host log: log objects in the bucket not yet folded into per-user objects (0 until the log is listed).",
        "userstore_replication_log_oldest_unstored_seconds": "Host log: how long the oldest commit not yet stored in the bucket has waited (0: none waits); what a durable write waits for at most, and the plain-write loss window now.",
        "userstore_replication_log_pending_bytes": "Host log: bytes of commits waiting to be written to the bucket.",
        "userstore_replication_log_objects_written": "Host log: log objects written to the bucket since the daemon started (one PUT each: group commit across stores).",
        "userstore_replication_log_objects_folded": "Host log: log objects folded into per-user objects and deleted since the daemon started.",
        "userstore_replication_shared_sync_waits": "Durable writes and sync passes since start that waited for a sync another caller had queued (group commit) instead of one of their own.",
        "userstore_replication_replica_verified": "1 while the replica's marker is there and is this data directory's replica, else 0 (missing, another replica, not reachable yet). While it is 0 no store is created or restored.",
        "userstore_replication_lease_held": "1 while this host holds the replica's writer lease (one host) and may acknowledge under it, else 0 (another host holds it, or it was not renewed in time: no store is served).",
        "userstore_replication_lease_epoch": "The epoch of the replica's writer lease, held here or seen held by another host (0 before any was read); every store is replicated under <user>/e<epoch>.",
        "userstore_request_duration_seconds": "Time from a call's arrival to its reply, by method.",
        "userstore_store_evictions_total": "Open stores closed to make room (maxOpenStores), because they were idle, or after a fleet migration opened them.",
        "userstore_store_opens_total": "Store files opened, by kind: created empty, reopened, created from the template, restored from a replica.",
        "userstore_stores": "Stores by state (the fleet index): current, pending (behind the migrations), failed, too_new.",
        "userstore_stores_encryption": "Stores by encryption (the fleet index, as of each store's last open): encrypted, plaintext.",
        "userstore_watchers": "Watch calls streaming now (io.userstore.Store.Watch).",
        "userstore_watchers_dropped_total": "Watch calls ended with WatchTooSlow: their client let more than watch.maxBufferedBytes of changes wait.",
        "userstore_watch_events_total": "Change events sent to watchers (one per transaction per watcher).",
        "userstore_transactions_open": "Interactive transactions open now (each holds its user's store).",
        "userstore_transactions_total": "Interactive transactions ended, by outcome: committed, rolled back by the client, expired (time-out or connection closed), aborted (by SQLite).",
    ]

    static func descriptor(_ name: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: help[name]!)
    }

    static func counter(_ registry: PrometheusCollectorRegistry, _ name: String, _ labels: [(String, String)] = []) -> CoreMetrics.Counter {
        CoreMetrics.Counter(label: name, dimensions: labels, handler: registry.makeCounter(descriptor: descriptor(name), labels: labels))
    }

    func record(_ event: StoreEvent) {
        switch event {
        case .storeCreated(_, _, let templateVersion): storeOpens[templateVersion == nil ? "created" : "from_template"]?.increment()
        case .storeOpened: storeOpens["reopened"]?.increment()
        case .storeRestored(_, let source, _, _) where source.contains("://"): storeOpens["restored"]?.increment() // from the replica
        case .storeClosed: evictions.increment()
        case .migrationFinished(_, _, _, _, let duration):
            migrationsOK.increment()
            migrationDuration.recordMicroseconds(duration)
        case .migrationFailed: migrationsFailed.increment()
        case .backupCreated(_, let path, _, _):
            backups.increment()
            backupBytes.increment(by: (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int64) ?? 0)
        default: break
        }
    }

    /// A watch began or ended (`userstore_watchers`, read at scrape), was dropped for reading
    /// too slowly, or sent a transaction.
    func watchStarted() { watchersOpen.add(1, ordering: .relaxed) }
    func watchEnded() { watchersOpen.subtract(1, ordering: .relaxed) }
    func watchDropped() { watchesDropped.increment() }
    func watchEventSent() { watchEvents.increment() }

    /// A transaction ended: `committed`, `rolled_back`, `expired` or `aborted`.
    func transactionEnded(_ outcome: String) {
        transactions[outcome]?.increment()
        transactionsOpen.subtract(1, ordering: .relaxed)
    }

    /// The bucket counters, each by what it lacks of `totals` (they only go up).
    private func recordBucketTraffic(_ totals: S3Client.Traffic) {
        bucketCounted.withLock { counted in
            for (name, values, previous) in [("userstore_replication_bucket_requests_total", totals.requests, counted.requests),
                                             ("userstore_replication_bucket_bytes_total", totals.bytes, counted.bytes)] {
                // The usual operations from the first scrape on, at 0 until the daemon uses them.
                for operation in Set(values.keys).union(["PUT", "GET", "DELETE", "LIST"]) {
                    let value = values[operation] ?? 0
                    Self.counter(registry, name, [("operation", operation)]).increment(by: max(0, value - (previous[operation] ?? 0)))
                }
            }
            counted = totals
        }
    }

    /// The whole exposition, with the gauges read now.
    func scrape(context: DaemonContext) -> [UInt8] {
        let counts = context.storeCounts().served
        gauges["connections"]?.set(context.connections.count)
        gauges["open"]?.set(context.registry.statistics.openStores)
        gauges["known"]?.set(counts.values.reduce(0, +))
        gauges["stores.current"]?.set(counts[.current] ?? 0)
        gauges["stores.pending"]?.set(counts[.pending] ?? 0)
        gauges["stores.failed"]?.set(counts[.failed] ?? 0)
        gauges["stores.too_new"]?.set(counts[.tooNew] ?? 0)
        let encryption = context.index.encryptionCounts()
        gauges["encryption.encrypted"]?.set(encryption.encrypted)
        gauges["encryption.plaintext"]?.set(encryption.plaintext)
        gauges["transactions"]?.set(transactionsOpen.load(ordering: .relaxed))
        gauges["watchers"]?.set(watchersOpen.load(ordering: .relaxed))
        if let replication = context.replicator?.snapshot {
            gauges["replication.degraded"]?.set(replication.degraded ? 1 : 0)
            gauges["replication.registered"]?.set(replication.registered)
            gauges["replication.unregistered"]?.set(replication.unregistered)
            // Litestream's time: kept at 0 for dashboards that read them.
            for retired in ["replication.pass", "replication.diverged", "replication.shared"] { gauges[retired]?.set(0) }
            gauges["replication.lag"]?.set(replication.log.oldestUnstoredSeconds)
            gauges["replication.syncs"]?.set(replication.syncs)
            gauges["replication.log.tail"]?.set(replication.log.tailObjects)
            gauges["replication.log.oldest"]?.set(replication.log.oldestUnstoredSeconds)
            gauges["replication.log.pending"]?.set(replication.log.pendingBytes)
            gauges["replication.log.written"]?.set(replication.log.objectsWritten)
            gauges["replication.log.folded"]?.set(replication.log.objectsFolded)
        }
        if let replicator = context.replicator {
            gauges["replication.verified"]?.set(replicator.identity.verdict.isVerified ? 1 : 0)
            if let lease = replicator.lease {
                gauges["replication.lease"]?.set(lease.isValid ? 1 : 0)
                gauges["replication.epoch"]?.set(Int(lease.snapshot.epoch ?? 0))
            }
        }
        if let traffic = context.replicator?.bucketTraffic { recordBucketTraffic(traffic) }
        let fleet = context.counters.withLock { $0.fleet }
        gauges["fleet.done"]?.set(fleet?.done ?? 0)
        gauges["fleet.failed"]?.set(fleet?.failures ?? 0)
        gauges["fleet.total"]?.set(fleet?.total ?? 0)
        let release = context.release.snapshot
        gauges["release.step"]?.set(release.step)
        gauges["release.failed"]?.set(release.failures.count)
        gauges["release.ratio"]?.set(context.release.failureRatio(of: release))
        for state in Release.State.allCases {
            gauges["release." + state.rawValue]?.set(release.state == state ? 1 : 0)
        }
        let process = ProcessStatistics.read()
        gauges["rss"]?.set(process.residentBytes)
        gauges["fds"]?.set(process.openFiles)
        cpuRecorded.withLock { recorded in
            if process.cpuSeconds > recorded {
                cpuSeconds.increment(by: process.cpuSeconds - recorded)
                recorded = process.cpuSeconds
            }
        }
        return registry.emitToBuffer() + emitRequestDurations()
    }
}

/// This process's memory, descriptors and CPU time, from /proc.
enum ProcessStatistics {
    struct Reading {
        var residentBytes = 0
        var openFiles = 0
        var cpuSeconds = 0.0
    }

    static func read() -> Reading {
        var reading = Reading()
        if let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
           let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
           let kib = Int(line.split(separator: " ").dropFirst().first ?? "") {
            reading.residentBytes = kib * 1024
        }
        reading.openFiles = max(0, ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd"))?.count ?? 1) - 1)
        if let stat = try? String(contentsOfFile: "/proc/self/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") {
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) {
                reading.cpuSeconds = (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
            }
        }
        return reading
    }
}
