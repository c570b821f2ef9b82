import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// The credentials of the process at the other end of a Unix socket, from the kernel.
struct PeerCredentials: Sendable, Equatable {
    var uid: UInt32
    var gid: UInt32
    var pid: Int32
    /// The peer user's groups in the group database (primary gid included).
    var groups: [UInt32]

    /// `struct ucred` of <sys/socket.h> (hidden behind _GNU_SOURCE from Swift).
    private struct UCred {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
    }

    private static let peerCredentialsOption: Int32 = 17 // SO_PEERCRED on Linux

    /// Reads `SO_PEERCRED` of `channel`; nil when it is not a Unix socket.
    static func read(from channel: any Channel) -> EventLoopFuture<PeerCredentials?> {
        guard let provider = channel as? any SocketOptionProvider else {
            return channel.eventLoop.makeSucceededFuture(nil)
        }
        let credentials: EventLoopFuture<UCred> = provider.unsafeGetSocketOption(
            level: NIOBSDSocket.OptionLevel(rawValue: SOL_SOCKET), name: NIOBSDSocket.Option(rawValue: peerCredentialsOption))
        return credentials.map { cred -> PeerCredentials? in
            PeerCredentials(uid: cred.uid, gid: cred.gid, pid: cred.pid, groups: groups(of: cred.uid, primary: cred.gid))
        }.recover { _ in nil }
    }

    /// The groups of `uid` in the group database. Membership is taken from the database (as
    /// sshd's AllowGroups does), not from the peer process, which the kernel only tells for up
    /// to a fixed number of groups.
    static func groups(of uid: UInt32, primary: UInt32) -> [UInt32] {
        guard let entry = getpwuid(uid), let name = entry.pointee.pw_name else { return [primary] }
        var count: Int32 = 64
        var list = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, primary, &list, &count) < 0 {
            list = [gid_t](repeating: 0, count: Int(count))
            _ = getgrouplist(name, primary, &list, &count)
        }
        return Array(list.prefix(Int(max(count, 0))))
    }
}
