import Logging
import Synchronization

/// The cluster's controller: one daemon at a time, elected by creating `/us/v1/controller`
/// bound to its host lease (create-if-absent; the key goes with the lease). The controller
/// alone writes bucket owner records: every bucket without a record or whose owner has no live
/// host record goes to the rendezvous owner among the live hosts, by compare-and-swap on the
/// record's epoch. Each of its transactions also compares the election key's lease with its
/// own, so a controller that lost its lease (paused, cut off) cannot write anything after.
///
/// Every daemon runs one; all but one only watch for the key to become free.
public final class ClusterController: Sendable {
    /// The election key.
    public static let key = "/us/v1/controller"

    private let etcd: EtcdClient
    private let membership: HostMembership
    private let logger: Logger
    private let elected = Mutex<Int64>(0) // the lease this host won the election with (0: not controller)

    public init(etcd: EtcdClient, membership: HostMembership, logger: Logger = Logger(label: "userstore.cluster")) {
        self.etcd = etcd
        self.membership = membership
        self.logger = logger
    }

    /// Whether this host is the controller (as of its last round).
    public var isController: Bool { elected.withLock { $0 != 0 } }

    /// One round: take the controller key if it is free; as controller, assign every bucket
    /// that has no live owner. Returns how many buckets were assigned.
    @discardableResult
    public func round() async throws -> Int {
        let lease = membership.lease
        guard lease != 0, membership.mayAcknowledge else {
            elected.withLock { $0 = 0 }
            return 0
        }
        let claim = try await etcd.create(Self.key, membership.host, lease: lease)
        let controller = claim.current.lease == lease && claim.current.text == membership.host
        let was = elected.withLock { state -> Int64 in
            defer { state = controller ? lease : 0 }
            return state
        }
        if controller && was != lease {
            logger.notice("\(membership.host) is the cluster controller", metadata: ["event": "cluster-controller", "host": .string(membership.host)])
        }
        guard controller else { return 0 }
        return try await assign(lease: lease)
    }

    /// Runs ``round()`` every `period` until cancelled.
    public func run(period: Duration = .seconds(1)) async {
        while !Task.isCancelled {
            let started = ContinuousClock.now
            do {
                try await round()
            } catch {
                logger.warning("cluster controller round failed: \(error)", metadata: ["event": "cluster-unreachable", "error": .string("\(error)")])
            }
            try? await Task.sleep(until: started + period, clock: .continuous) // the round period
        }
    }

    /// One round's work as controller: every bucket without a live owner to its rendezvous owner
    /// among the hosts not being drained; then each move (asked with ``ClusterKeys/move(_:)`` or
    /// implied by a drain) one step further: `active` → `draining` (the owner syncs and closes
    /// the bucket's stores, then writes ``ClusterKeys/released(_:)`` with the draining epoch) →
    /// the target, `active`. Returns how many records it changed.
    func assign(lease: Int64) async throws -> Int {
        let live = Set(try await etcd.list(prefix: HostMembership.prefix).map { String($0.key.dropFirst(HostMembership.prefix.count)) })
        guard !live.isEmpty else { return 0 }
        let draining = Set(try await etcd.list(prefix: ClusterKeys.drains).map { String($0.key.dropFirst(ClusterKeys.drains.count)) })
        let unfit = Set(try await etcd.list(prefix: ClusterKeys.unfit).map { String($0.key.dropFirst(ClusterKeys.unfit.count)) })
        // New owners among the live hosts not drained and not unfit (seeing no replica of their
        // own); with none, among those not drained; with none, among every live host.
        let candidates = [live.subtracting(draining).subtracting(unfit), live.subtracting(draining), live]
        let eligible = candidates.first { !$0.isEmpty }!
        var records: [Int: (record: BucketRecord?, revision: Int64)] = [:]
        for item in try await etcd.list(prefix: BucketRecord.prefix) {
            if let bucket = BucketRecord.bucket(ofKey: item.key) { records[bucket] = (BucketRecord(json: item.value), item.modRevision) }
        }
        var moves: [Int: String] = [:]
        for item in try await etcd.list(prefix: ClusterKeys.moves) {
            if let bucket = Int(item.key.dropFirst(ClusterKeys.moves.count)), let target = MoveRequest(json: item.value)?.to { moves[bucket] = target }
        }
        var released: [Int: Int64] = [:]
        for item in try await etcd.list(prefix: ClusterKeys.releases) {
            if let bucket = Int(item.key.dropFirst(ClusterKeys.releases.count)) { released[bucket] = Int64(item.text) }
        }

        var changes: [(key: String, expectedModRevision: Int64, value: String)] = []
        var finished: [String] = [] // move requests and release notes done with
        for bucket in 0..<Placement.bucketCount {
            let key = BucketRecord.key(of: bucket)
            guard let (record, revision) = records[bucket], let record, live.contains(record.owner) else {
                // No live owner: the move's target if it is live, else the rendezvous owner.
                let target = moves[bucket].flatMap { live.contains($0) ? $0 : nil } ?? Placement.rendezvousOwner(of: bucket, among: eligible)!
                changes.append((key, records[bucket]?.revision ?? 0, BucketRecord(owner: target).json))
                if moves[bucket] != nil { finished.append(ClusterKeys.move(bucket)) }
                continue
            }
            var target = moves[bucket]
            if target == nil, draining.contains(record.owner) { target = Placement.rendezvousOwner(of: bucket, among: eligible) }
            guard let target else { continue }
            if target == record.owner || !live.contains(target) {
                // Nowhere to go (the target is the owner, or gone): the move ends here.
                if record.state == .draining { changes.append((key, revision, BucketRecord(owner: record.owner).json)) }
                if moves[bucket] != nil { finished.append(ClusterKeys.move(bucket)) }
                continue
            }
            switch record.state {
            case .active:
                changes.append((key, revision, BucketRecord(owner: record.owner, state: .draining).json))
            case .draining where released[bucket] == revision:
                changes.append((key, revision, BucketRecord(owner: target).json))
                finished += [ClusterKeys.released(bucket)] + (moves[bucket] != nil ? [ClusterKeys.move(bucket)] : [])
            case .draining:
                break // the owner is still syncing and closing the bucket's stores
            }
        }
        var applied = 0
        // 127 records and the election-key guard: etcd's 128 comparisons per transaction.
        for start in stride(from: 0, to: changes.count, by: 127) {
            let batch = Array(changes[start..<min(start + 127, changes.count)])
            guard let epoch = try await etcd.swapAll(batch, guardedBy: (Self.key, lease)) else {
                // A record changed since it was read, or this host is no longer the controller:
                // the next round reads again.
                logger.info("cluster controller: bucket records changed meanwhile; next round reads them again")
                return applied
            }
            applied += batch.count
            logger.info("cluster controller changed \(batch.count) bucket records at epoch \(epoch)", metadata: [
                "event": "cluster-buckets-assigned", "count": "\(batch.count)", "epoch": "\(epoch)",
            ])
        }
        for start in stride(from: 0, to: finished.count, by: 128) {
            try await etcd.write(deletes: Array(finished[start..<min(start + 128, finished.count)]))
        }
        return applied
    }
}
