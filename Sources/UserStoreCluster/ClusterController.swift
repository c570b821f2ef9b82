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
        return try await assignOrphanedBuckets(lease: lease)
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

    func assignOrphanedBuckets(lease: Int64) async throws -> Int {
        let hosts = Set(try await etcd.list(prefix: HostMembership.prefix).map { String($0.key.dropFirst(HostMembership.prefix.count)) })
        guard !hosts.isEmpty else { return 0 }
        var records: [Int: EtcdKeyValue] = [:]
        for item in try await etcd.list(prefix: BucketRecord.prefix) {
            if let bucket = BucketRecord.bucket(ofKey: item.key) { records[bucket] = item }
        }
        var changes: [(key: String, expectedModRevision: Int64, value: String)] = []
        for bucket in 0..<Placement.bucketCount {
            let current = records[bucket]
            if let current, let record = BucketRecord(json: current.value), hosts.contains(record.owner) { continue }
            let owner = Placement.rendezvousOwner(of: bucket, among: hosts)!
            changes.append((BucketRecord.key(of: bucket), current?.modRevision ?? 0, BucketRecord(owner: owner).json))
        }
        var assigned = 0
        // 127 records and the election-key guard: etcd's 128 comparisons per transaction.
        for start in stride(from: 0, to: changes.count, by: 127) {
            let batch = Array(changes[start..<min(start + 127, changes.count)])
            guard let epoch = try await etcd.swapAll(batch, guardedBy: (Self.key, lease)) else {
                // A record changed since it was read, or this host is no longer the controller:
                // the next round reads again.
                logger.info("cluster controller: bucket records changed meanwhile; next round reads them again")
                break
            }
            assigned += batch.count
            logger.info("cluster controller assigned \(batch.count) buckets at epoch \(epoch)", metadata: [
                "event": "cluster-buckets-assigned", "count": "\(batch.count)", "epoch": "\(epoch)",
            ])
        }
        return assigned
    }
}
