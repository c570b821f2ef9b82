import Logging
import Synchronization
import ServiceLifecycle
import UserStoreCluster
import UserStoreConfiguration
import UserStoreCore
import UserStoreReplication

/// This daemon's part in a cluster (`cluster.*`, docs/cluster.md): its host lease, the
/// controller every daemon may become, local copies of the host and bucket records, and the
/// placement check every request passes (the registry asks ``admit(_:)`` before every lease).
package final class DaemonCluster: StorePlacement, ReplicaFencing, Service {
    package let settings: ClusterSettings
    package let etcd: EtcdClient
    package let membership: HostMembership
    package let controller: ClusterController
    package let buckets: PrefixMirror<BucketRecord>
    package let hosts: PrefixMirror<HostRecord>
    /// Mutual TLS between daemons (`cluster.tls.*`); nil: no listener, no forwarding.
    package let tls: PeerTLS?
    /// Forwards calls for users other hosts own (`cluster.forward` with `cluster.tls`).
    package let forwarder: Forwarder?
    private let logger: Logger
    private let keepAlive = Mutex<Task<Void, Never>?>(nil)
    /// The registry whose stores a moving bucket closes (set once it exists: it needs this
    /// placement first).
    private let registry = Mutex<StoreRegistry?>(nil)
    private let engine = Mutex<LogReplicator?>(nil)
    /// Buckets this host released, by the draining epoch it released them at.
    private let released = Mutex<[Int: Int64]>([:])
    /// The replica's marker against this data directory's binding (nil: replication off).
    private let replicaIdentity = Mutex<ReplicaIdentity?>(nil)
    /// The lease under which this host put its own unfit key (it sees no replica of its own);
    /// nil while it has none.
    private let unfitUnder = Mutex<Int64?>(nil)

    package init(settings: ClusterSettings, tls: PeerTLS?, logger: Logger) {
        self.settings = settings
        self.tls = tls
        self.logger = logger
        etcd = EtcdClient(endpoints: settings.etcd)
        membership = HostMembership(etcd: etcd, host: settings.host, record: HostRecord(address: settings.address).json,
                                    ttlSeconds: settings.leaseSeconds, margin: .seconds(Double(settings.leaseSeconds) / 10), logger: logger)
        controller = ClusterController(etcd: etcd, membership: membership, logger: logger)
        let buckets = PrefixMirror(etcd: etcd, prefix: BucketRecord.prefix, logger: logger) { BucketRecord(json: $0.value) }
        let hosts = PrefixMirror(etcd: etcd, prefix: HostMembership.prefix, logger: logger) { HostRecord(json: $0.value) }
        self.buckets = buckets
        self.hosts = hosts
        forwarder = settings.forward ? tls.map { Forwarder(host: settings.host, buckets: buckets, hosts: hosts, tls: $0.client,
                                                           timeoutMilliseconds: settings.forwardTimeoutMilliseconds) } : nil
    }

    package func bucket(of user: UserID) -> Int { Placement.bucket(for: user) }

    package func epoch(of user: UserID) -> Int64? { buckets["\(Placement.bucket(for: user))"]?.modRevision }

    package var ownedEpochsSeen: [Int: Int64] { ownedEpochs(in: buckets.all) }

    package func ownedEpochs() async throws -> [Int: Int64] {
        var owned: [Int: Int64] = [:]
        for record in try await etcd.list(prefix: BucketRecord.prefix) {
            guard let bucket = BucketRecord.bucket(ofKey: record.key), BucketRecord(json: record.value)?.owner == settings.host else { continue }
            owned[bucket] = record.modRevision
        }
        return owned
    }

    /// The buckets this host owns now, by its copy of the bucket records: one look at the
    /// records for a pass over many stores (whose buckets the fleet index keeps).
    package func ownedBuckets() -> Set<Int> { owned(in: buckets.all) }

    /// The buckets of `records` (a copy of the bucket records) this host owns.
    private func owned(in records: [String: PrefixMirror<BucketRecord>.Entry]) -> Set<Int> {
        Set(ownedEpochs(in: records).keys)
    }

    /// The buckets of `records` this host owns, at their epochs.
    private func ownedEpochs(in records: [String: PrefixMirror<BucketRecord>.Entry]) -> [Int: Int64] {
        var owned: [Int: Int64] = [:]
        for (name, entry) in records where entry.value.owner == settings.host {
            if let bucket = Int(name) { owned[bucket] = entry.modRevision }
        }
        return owned
    }

    /// The records as the release's completion needs them; nil until this host's copies are
    /// current: it has joined (its lease alive, its own host record read) and read the bucket
    /// records since (before that it would own nothing and see no owners).
    package func releaseView() -> SharedRelease.View? {
        let joined = membership.joinedRevision
        guard membership.mayAcknowledge, joined > 0, buckets.revision >= joined, hosts[settings.host] != nil else { return nil }
        let records = buckets.all
        let covered = records.count == Placement.bucketCount && records.values.allSatisfy { $0.value.state == .active }
        return SharedRelease.View(owned: owned(in: records), owners: covered ? Set(records.values.map(\.value.owner)) : nil,
                                  lease: membership.lease)
    }

    /// The cluster's release in etcd, as this host takes part in it. Weak: the release
    /// tracker that keeps it is reached from this cluster (through the registry's gate).
    package var sharedRelease: SharedRelease {
        SharedRelease(etcd: etcd, host: settings.host, view: { [weak self] in self?.releaseView() })
    }

    package func admit(_ user: UserID) throws(StoreError) {
        let bucket = Placement.bucket(for: user)
        guard let entry = buckets["\(bucket)"] else {
            throw .clusterUnavailable(user: user, message: "bucket \(bucket) has no owner record yet (the cluster controller assigns it)")
        }
        guard entry.value.owner == settings.host else {
            throw .wrongHost(user: user, host: entry.value.owner, address: hosts[entry.value.owner]?.value.address ?? "", epoch: entry.modRevision)
        }
        guard entry.value.state == .active else {
            throw .retry(user: user, reason: "bucket \(bucket) is moving to another host")
        }
        guard membership.mayAcknowledge else {
            throw .clusterUnavailable(user: user, message: "host \(settings.host) has not renewed its etcd lease in time; it serves again once it has")
        }
        // After a lost lease the host joined again; records read before that may miss moves
        // made while it was away (another host may own the bucket now).
        guard buckets.revision >= membership.joinedRevision else {
            throw .clusterUnavailable(user: user, message: "host \(settings.host) joined again and is reading the bucket records")
        }
    }

    /// The acknowledge rule for a durable write, once the replica has it: this host may still
    /// acknowledge (its lease deadline), and etcd — read now, linearizably — still names it the
    /// owner of the user's bucket, active, at `epoch` (the one its replica path carries).
    /// Returns the epoch confirmed.
    @discardableResult
    package func confirmOwnership(of user: UserID, epoch: Int64?) async throws(StoreError) -> Int64 {
        let bucket = Placement.bucket(for: user)
        let record: EtcdKeyValue?
        do {
            record = try await etcd.get(BucketRecord.key(of: bucket))
        } catch {
            throw .clusterUnavailable(user: user, message: "committed here and in the replica, but etcd could not confirm this host still owns bucket \(bucket): \(error)")
        }
        if let record, let owner = BucketRecord(json: record.value), owner.owner == settings.host, owner.state == .active,
           let epoch, record.modRevision > epoch {
            // Still ours at a newer epoch (a move that was called off): the store replicates
            // under an epoch nobody restores from any more. Closed once its requests are done
            // (with its final sync), it opens again under the bucket's epoch.
            let registry = self.registry.withLock { $0 }
            Task { _ = await registry?.closeStores { $0 == user } }
        }
        guard let record, let owner = BucketRecord(json: record.value), owner.owner == settings.host, owner.state == .active,
              epoch == nil || record.modRevision == epoch else {
            throw .clusterUnavailable(user: user, message: "committed here and in the replica under epoch \(epoch ?? 0), but bucket \(bucket) is now \(record.flatMap { BucketRecord(json: $0.value) }.map { "\($0.owner)'s (\($0.state.rawValue))" } ?? "unassigned") at epoch \(record?.modRevision ?? 0): the write may be lost")
        }
        guard membership.mayAcknowledge else {
            throw .clusterUnavailable(user: user, message: "committed here and in the replica, but host \(settings.host) has not renewed its etcd lease in time")
        }
        return record.modRevision
    }

    /// Joins (retrying until etcd answers), then keeps the controller and the copies of the
    /// records going until shutdown. The lease is kept alive apart from this service, until
    /// ``leave()``: the daemon leaves only after every store's final sync, so the next owner
    /// restores everything this host acknowledged.
    package func run() async throws {
        // A host that sees no replica of its own claims no bucket: it joins only once the
        // replica's marker is this data directory's (or cannot be told yet: an outage).
        var waiting = false
        while !Task.isShuttingDownGracefully, replicaRefused() {
            if !waiting {
                logger.error("not joining the cluster while the replica is not this data directory's; joins once it is", metadata: ["event": "cluster-unreachable"])
                waiting = true
            }
            do { try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) } } catch { return }
        }
        while !Task.isShuttingDownGracefully {
            do {
                try await membership.join()
                break
            } catch {
                logger.error("cannot join the cluster: \(error); retrying", metadata: ["event": "cluster-unreachable", "error": .string("\(error)")])
                do { try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) } } catch { return } // retry period
            }
        }
        guard !Task.isShuttingDownGracefully else { return }
        let membership = self.membership
        let buckets = self.buckets, hosts = self.hosts, logger = self.logger
        keepAlive.withLock {
            $0 = Task {
                await membership.keepAlive(onRejoin: {
                    do {
                        try await buckets.refresh()
                        try await hosts.refresh()
                    } catch {
                        // The watch loops read them again; admit() refuses until they have.
                        logger.warning("reading the cluster records after joining again: \(error)", metadata: ["event": "cluster-unreachable", "error": .string("\(error)")])
                    }
                })
            }
        }
        let controller = self.controller
        _ = await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { await controller.run() }
                group.addTask { await buckets.run() }
                group.addTask { await hosts.run() }
                group.addTask { [self] in
                    while !Task.isCancelled {
                        await markUnfitWhileReplicaRefused()
                        await releaseDrainingBuckets()
                        try? await Task.sleep(for: .milliseconds(200)) // how soon a drain is noticed
                    }
                }
            }
        }
    }

    package func attach(_ registry: StoreRegistry) { self.registry.withLock { $0 = registry } }

    /// The replication engine, which says when a moving bucket's last commits are stored.
    package func attach(engine: LogReplicator?) { self.engine.withLock { $0 = engine } }

    /// The replica's identity, which decides whether this host may claim buckets.
    package func attach(_ identity: ReplicaIdentity?) { replicaIdentity.withLock { $0 = identity } }

    /// Whether the replica is missing or another one for this host (its marker checked by the
    /// replication's health check every second while it fails).
    private func replicaRefused() -> Bool {
        replicaIdentity.withLock { $0 }?.verdict.refusesReplication ?? false
    }

    /// While this host sees no replica of its own it is unfit (``ClusterKeys/unfit``): the
    /// controller gives it no new bucket — a host that takes a bucket over restores its users
    /// from the replica — but leaves it those it owns: their stores may hold what the replica
    /// lacks, and are shipped whole again once it is back. Taken back once it sees the replica.
    package func markUnfitWhileReplicaRefused() async {
        let refused = replicaRefused(), lease = membership.lease, under = unfitUnder.withLock { $0 }
        guard lease != 0, refused ? under != lease : under != nil else { return }
        let key = ClusterKeys.unfit(settings.host)
        do {
            if refused {
                _ = try await etcd.put(key, "replica-unverified", lease: lease)
                logger.error("this host sees no replica of its own: it takes no new bucket until it does", metadata: [
                    "event": "cluster-unreachable", "host": .string(settings.host),
                ])
                unfitUnder.withLock { $0 = lease }
            } else {
                _ = try await etcd.delete(key)
                logger.notice("the replica is this host's again: it takes buckets again", metadata: ["event": "cluster-joined", "host": .string(settings.host)])
                unfitUnder.withLock { $0 = nil }
            }
        } catch {
            logger.warning("cannot \(refused ? "mark" : "unmark") this host unfit for its replica: \(error)", metadata: ["event": "cluster-unreachable", "error": .string("\(error)")])
        }
    }

    /// Releases every bucket of this host that the controller marked `draining`: its open
    /// stores are closed once their requests are done (each with its final sync), then
    /// `/us/v1/released/<bucket>` says so with the draining epoch. Requests for the bucket get
    /// `Retry` meanwhile (``admit(_:)``).
    package func releaseDrainingBuckets() async {
        guard let registry = registry.withLock({ $0 }) else { return }
        let draining = buckets.all.compactMap { name, entry -> (bucket: Int, epoch: Int64)? in
            guard entry.value.owner == settings.host, entry.value.state == .draining, let bucket = Int(name) else { return nil }
            return (bucket, entry.modRevision)
        }.filter { item in released.withLock { $0[item.bucket] } != item.epoch }
        guard !draining.isEmpty else { return }
        let wanted = Set(draining.map(\.bucket))
        let closed = await registry.closeStores { wanted.contains(Placement.bucket(for: $0)) }
        // Their last commits in the replica, or the bucket stays this host's (draining: its users
        // get Retry) and the release is tried again in a moment.
        if let engine = self.engine.withLock({ $0 }), await !engine.lastCommitsStored(until: engine.durableDeadline) {
            logger.warning("not releasing \(draining.count) moving buckets yet: the replica has not stored their stores' last commits (\(engine.snapshot.lastError ?? "it is slow")); trying again",
                           metadata: ["event": "replication-degraded"])
            return
        }
        // Only now (every store of those buckets synced and closed) may the next owner start.
        for start in stride(from: 0, to: draining.count, by: 128) {
            let batch = Array(draining[start..<min(start + 128, draining.count)])
            do {
                try await etcd.write(puts: batch.map { (ClusterKeys.released($0.bucket), String($0.epoch)) })
                released.withLock { for item in batch { $0[item.bucket] = item.epoch } }
            } catch {
                logger.warning("cannot tell etcd that buckets are released: \(error)", metadata: ["event": "cluster-unreachable", "error": .string("\(error)")])
                return
            }
        }
        logger.notice("released \(draining.count) moving buckets: \(closed) stores synced and closed", metadata: [
            "event": "cluster-bucket-released", "count": "\(draining.count)", "stores": "\(closed)",
            "bucket": "\(draining.count == 1 ? String(draining[0].bucket) : "several")",
        ])
    }

    /// Ends the lease (the host record goes with it), so the controller moves this host's
    /// buckets at once instead of after the lease's TTL. Call after every store is closed.
    package func leave() async {
        guard let task = keepAlive.withLock({ $0 }) else { return }
        await membership.leave()
        task.cancel()
        await task.value
        logger.notice("left the cluster", metadata: ["event": "cluster-left", "host": .string(settings.host)])
    }
}

