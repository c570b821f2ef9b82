import UserStoreCore

/// Epoch-fenced replica paths, with more than one host (docs/cluster.md): each owner of a
/// bucket replicates its users under the bucket's epoch, so a host that lost the bucket (and
/// may still ship what it had) writes where the next owner never reads after its first write.
package protocol ReplicaFencing: Sendable {
    /// `user`'s bucket.
    func bucket(of user: UserID) -> Int
    /// The epoch of `user`'s bucket as this host sees it (nil: no owner record seen).
    func epoch(of user: UserID) -> Int64?
    /// The buckets this host owns at their epochs, as its copy of the records shows them now.
    var ownedEpochsSeen: [Int: Int64] { get }
    /// The buckets this host owns now at their epochs, by a linearizable read of etcd (the log
    /// engine's fold and fences). Throws when etcd does not answer.
    func ownedEpochs() async throws -> [Int: Int64]
}

