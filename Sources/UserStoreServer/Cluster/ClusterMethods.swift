import UserStoreCluster
import Varlink

/// `io.userstore.Admin.Cluster`: the cluster as this daemon sees it.
struct ClusterMethods {
    let context: DaemonContext

    /// Handles `request` if it is one of these methods; false otherwise.
    func handle(_ request: Request, send: @escaping ReplySink) async throws -> Bool {
        guard request.call.member == "Cluster" else { return false }
        guard let cluster = context.cluster else { throw VarlinkError("io.userstore.Admin.ClusterOff") }
        try await send(VarlinkReply.encode(await Self.status(cluster)))
        return true
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
        var fields: [String: JSONValue] = [
            "host": .string(cluster.settings.host),
            "mayAcknowledge": .bool(cluster.membership.mayAcknowledge),
            "leaseRemainingSeconds": .real((Double(cluster.membership.remaining.components.seconds) * 1000
                + Double(cluster.membership.remaining.components.attoseconds) / 1e15).rounded() / 1000),
            "hosts": .array(names.map { name in
                .object([
                    "name": .string(name), "address": .string(hosts[name]?.value.address ?? ""), "live": .bool(hosts[name] != nil),
                    "buckets": .integer(buckets[name]?.count ?? 0), "newestEpoch": .integer(buckets[name]?.newest ?? 0),
                ])
            }),
            "unassignedBuckets": .integer(Int64(Placement.bucketCount - records.count)),
        ]
        if let controller = try? await cluster.etcd.get(ClusterController.key) { fields["controller"] = .string(controller.text) }
        return fields
    }
}
