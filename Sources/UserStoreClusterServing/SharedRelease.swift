import UserStoreCluster
import UserStoreCore

/// The release of a cluster, kept in etcd (`/us/v1/release`) so that every host applies the
/// same release, step and cohort, and a halt on one host stops them all (docs/releases.md).
package struct SharedRelease: Sendable {
    package static let key = "/us/v1/release"
    /// `/us/v1/release-done/<release id>/<host>`, bound to the host's lease: at the release's
    /// last step, the host found every store it knows, in the buckets it owns, at the release's
    /// version. The release is complete once the owner of every bucket has said so.
    package static let donePrefix = "/us/v1/release-done/"
    package let etcd: EtcdClient
    /// This host's name (`cluster.host`).
    package let host: String
    /// What this host's copies of the cluster's records say now, for judging completion; nil
    /// until they are current (read since it last joined, its own lease alive).
    package let view: @Sendable () -> View?

    package struct View: Sendable {
        /// The buckets this host owns.
        package var owned: Set<Int>
        /// The owners of all 4,096 buckets; nil while one has no record or is moving.
        package var owners: Set<String>?
        /// This host's lease: its reports go with it.
        package var lease: Int64
    }

    /// A change that kept losing the compare-and-swap to other hosts.
    package struct Contended: Error, CustomStringConvertible {
        package var description: String { "the cluster's release kept changing under this host (\(SharedRelease.key)); try again" }
    }

    /// The record and its `modRevision`; nil when there is none yet.
    package func read() async throws -> (release: Release, revision: Int64)? {
        guard let current = try await etcd.get(Self.key) else { return nil }
        return (try ReleaseFile.decode(current.value), current.modRevision)
    }

    /// Applies `transform` to the record as it is now (nil: none yet) and writes the result with
    /// a compare-and-swap, reading and applying again when another host wrote first. A
    /// transform that returns nil, or the record unchanged, writes nothing. Returns the record
    /// now (nil: still none).
    package func update(_ transform: (Release?) throws -> Release?) async throws -> (release: Release, revision: Int64)? {
        for _ in 0..<64 {
            let current = try await read()
            guard let next = try transform(current?.release) else { return current }
            if let current, next == current.release { return current }
            if let revision = try await etcd.swap(Self.key, expectedModRevision: current?.revision ?? 0, to: try ReleaseFile.encode(next)) {
                return (next, revision)
            }
        }
        throw Contended()
    }

    /// Says (or takes back) that this host is done with release `id`; bound to its `lease`,
    /// so a host that dies or loses its lease no longer counts as done.
    package func report(_ id: String, done: Bool, lease: Int64) async throws {
        let key = Self.donePrefix + id + "/" + host
        if done { _ = try await etcd.put(key, "1", lease: lease) } else { _ = try await etcd.delete(key) }
    }

    /// The hosts that said they are done with release `id`.
    package func hostsDone(_ id: String) async throws -> Set<String> {
        let prefix = Self.donePrefix + id + "/"
        return Set(try await etcd.list(prefix: prefix).map { String($0.key.dropFirst(prefix.count)) })
    }

    /// Forgets the hosts' reports of release `id` (complete: they are not read again). Only
    /// that release's: another may have started meanwhile, and its reports are not sent twice.
    package func forgetReports(of id: String) async throws {
        for item in try await etcd.list(prefix: Self.donePrefix + id + "/") { _ = try await etcd.delete(item.key) }
    }
}
