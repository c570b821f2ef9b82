import Crypto
import UserStoreCore

/// Where a user lives when there is more than one host: users fall into a fixed number of
/// buckets by a hash of their ID, and each bucket has one owner host (its record in etcd).
///
/// The bucket never changes for a user (it depends on the ID alone), so moving users between
/// hosts means moving buckets, explicitly, with a new epoch each time. Hashing over the live
/// hosts alone would let a host that is cut off keep computing its own view (docs/cluster.md).
public enum Placement {
    /// The number of buckets: fixed for the life of a cluster (changing it moves everyone).
    public static let bucketCount = 4096

    /// `user`'s bucket: the first 8 bytes of SHA-256 of the ID's UTF-8 bytes, read as a
    /// big-endian unsigned integer, modulo ``bucketCount``.
    public static func bucket(for user: UserID) -> Int {
        Int(prefix64(SHA256.hash(data: Array(user.rawValue.utf8))) % UInt64(bucketCount))
    }

    /// The host `bucket` goes to among `hosts` by rendezvous (highest random weight) hashing:
    /// the host whose SHA-256 of `"<host>/<bucket>"` is highest. A host leaving moves only the
    /// buckets it had; one joining takes about 1/N of them. Nil when `hosts` is empty.
    public static func rendezvousOwner(of bucket: Int, among hosts: some Sequence<String>) -> String? {
        hosts.max { score($0, bucket) < score($1, bucket) || (score($0, bucket) == score($1, bucket) && $0 > $1) }
    }

    private static func score(_ host: String, _ bucket: Int) -> UInt64 {
        prefix64(SHA256.hash(data: Array("\(host)/\(bucket)".utf8)))
    }

    private static func prefix64(_ digest: SHA256.Digest) -> UInt64 {
        digest.withUnsafeBytes { bytes in bytes.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
    }
}
