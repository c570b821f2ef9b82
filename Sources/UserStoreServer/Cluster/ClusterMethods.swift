import UserStoreCluster
import UserStoreClusterServing
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin.Cluster`, `MoveBucket`, `DrainHost` and `Rebalance`: the cluster as this
/// daemon sees it, and an operator's moves (carried out by the controller).
struct ClusterMethods {
    let context: DaemonContext

    /// Handles `request`, a call of `method` (one of these).
    func handle(_ method: Method, _ request: Request, send: @escaping ReplySink) async throws {
        guard let cluster = context.cluster else { throw VarlinkError(.clusterOff) }
        let parameters = request.parameters
        switch method {
        case .moveBucket:
            let bucket = try parameters.int("bucket")
            guard (0..<Int64(Placement.bucketCount)).contains(bucket) else { throw VarlinkError.invalidParameter("bucket") }
            let host = try parameters.string("host")
            guard cluster.hosts[host] != nil else { throw VarlinkError(.noSuchHost, ["host": .string(host)]) }
            try await cluster.etcd.put(ClusterKeys.move(Int(bucket)), MoveRequest(to: host).json)
            let from = cluster.buckets["\(bucket)"]?.value.owner ?? ""
            try await send(VarlinkReply.encode(["bucket": .integer(bucket), "from": .string(from), "to": .string(host)]))
        case .drainHost:
            let host = try parameters.string("host")
            // Bound to the host's own lease: the drain ends when the host leaves (or restarts).
            guard let record = try await cluster.etcd.get(HostMembership.key(of: host)), record.lease != 0 else {
                throw VarlinkError(.noSuchHost, ["host": .string(host)])
            }
            try await cluster.etcd.put(ClusterKeys.drain(host), "", lease: record.lease)
            let owned = cluster.buckets.all.values.filter { $0.value.owner == host }.count
            try await send(VarlinkReply.encode(["host": .string(host), "buckets": .integer(Int64(owned))]))
        case .rebalance:
            try await send(VarlinkReply.encode(["moves": .integer(Int64(try await Self.rebalance(cluster)))]))
        default:
            try await send(VarlinkReply.encode(await Self.status(cluster)))
        }
    }

    /// Asks the controller to move every bucket whose owner is not its rendezvous owner among
    /// the live hosts not being drained (a host that joined takes its share; nothing else
    /// moves); returns how many moves were asked.
    static func rebalance(_ cluster: DaemonCluster) async throws -> Int {
        let drained = Set(try await cluster.etcd.list(prefix: ClusterKeys.drains).map { String($0.key.dropFirst(ClusterKeys.drains.count)) })
        let eligible = Set(cluster.hosts.all.keys).subtracting(drained)
        guard !eligible.isEmpty else { return 0 }
        let records = cluster.buckets.all
        let moves = (0..<Placement.bucketCount).compactMap { bucket -> (key: String, value: String)? in
            guard let owner = records["\(bucket)"]?.value.owner, let target = Placement.rendezvousOwner(of: bucket, among: eligible),
                  owner != target else { return nil }
            return (ClusterKeys.move(bucket), MoveRequest(to: target).json)
        }
        for start in stride(from: 0, to: moves.count, by: 128) { // etcd's operations per transaction
            try await cluster.etcd.write(puts: Array(moves[start..<min(start + 128, moves.count)]))
        }
        return moves.count
    }

    static func status(_ cluster: DaemonCluster) async -> [String: JSONValue] {
        var buckets: [String: (count: Int64, newest: Int64)] = [:]
        let records = cluster.buckets.all
        for entry in records.values {
            let current = buckets[entry.value.owner] ?? (0, 0)
            buckets[entry.value.owner] = (current.count + 1, max(current.newest, entry.modRevision))
        }
        let hosts = cluster.hosts.all
        let names = Set(hosts.keys).union(buckets.keys).sorted()
        let draining = Set(((try? await cluster.etcd.list(prefix: ClusterKeys.drains)) ?? []).map { String($0.key.dropFirst(ClusterKeys.drains.count)) })
        let requested = ((try? await cluster.etcd.list(prefix: ClusterKeys.moves)) ?? []).count
        var fields: [String: JSONValue] = [
            "host": .string(cluster.settings.host),
            "mayAcknowledge": .bool(cluster.membership.mayAcknowledge),
            "leaseRemainingSeconds": .real((Double(cluster.membership.remaining.components.seconds) * 1000
                + Double(cluster.membership.remaining.components.attoseconds) / 1e15).rounded() / 1000),
            "hosts": .array(names.map { name in
                .object([
                    "name": .string(name), "address": .string(hosts[name]?.value.address ?? ""), "live": .bool(hosts[name] != nil),
                    "draining": .bool(draining.contains(name)),
                    "buckets": .integer(buckets[name]?.count ?? 0), "newestEpoch": .integer(buckets[name]?.newest ?? 0),
                ])
            }),
            "unassignedBuckets": .integer(Int64(Placement.bucketCount - records.count)),
            "movingBuckets": .integer(Int64(records.values.filter { $0.value.state == .draining }.count)),
            "requestedMoves": .integer(Int64(requested)),
        ]
        if let controller = try? await cluster.etcd.get(ClusterController.key) { fields["controller"] = .string(controller.text) }
        return fields
    }
}
