#if canImport(Glibc)
import Glibc
#endif

/// The peer's identity from the kernel (`SO_PEERCRED`, read by ``Connection``), and its groups.
enum PeerCredentials {
    /// The groups of `uid` in the group database. Membership is taken from the database (as
    /// sshd's AllowGroups does), not from the peer process, which the kernel only tells for up
    /// to a fixed number of groups.
    static func groups(of uid: UInt32, primary: UInt32) -> [UInt32] {
        // getpwuid_r: two event loops may accept at once (getpwuid's buffer is shared).
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var storage = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid, &entry, &storage, storage.count, &result) == 0, result != nil, let name = entry.pw_name else { return [primary] }
        var count: Int32 = 64
        var list = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, primary, &list, &count) < 0 {
            list = [gid_t](repeating: 0, count: Int(count))
            _ = getgrouplist(name, primary, &list, &count)
        }
        return Array(list.prefix(Int(max(count, 0))))
    }
}
