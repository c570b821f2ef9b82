#if canImport(Glibc)
import Glibc
#endif

/// Who may use which interface, decided from the peer's credentials (`SO_PEERCRED`).
///
/// - root and the daemon's own user are always administrators;
/// - administrators (`access.adminUsers`, `access.adminGroups`) may use both interfaces;
/// - clients (`access.clientUsers`, `access.clientGroups`) may use `io.userstore.Store`;
/// - with `access.perUnixUserStores`, a client that is not an administrator reaches exactly one
///   store: the one named by its own numeric uid.
public struct AccessRules: Sendable, Equatable {
    public var clientUsers: Set<UInt32> = []
    public var clientGroups: Set<UInt32> = []
    public var adminUsers: Set<UInt32> = []
    public var adminGroups: Set<UInt32> = []
    public var perUnixUserStores = false

    public init() {}

    /// What a peer may do.
    public struct Grant: Sendable, Equatable {
        public var store: Bool
        public var admin: Bool
        /// The only store this peer may reach, when stores are per Unix user.
        public var onlyStore: String?

        public init(store: Bool, admin: Bool, onlyStore: String?) {
            self.store = store
            self.admin = admin
            self.onlyStore = onlyStore
        }
    }

    /// The grant for a peer with `uid`, primary `gid` and supplementary `groups`. `groups` is
    /// asked for only when a rule names a group the primary `gid` does not decide: it is a
    /// lookup in the user and group databases (files, or LDAP through NSS), made on the loop
    /// that accepts the connection.
    public func grant(uid: UInt32, gid: UInt32, groups: () -> [UInt32]) -> Grant {
        var looked: Set<UInt32>?
        func isMember(of named: Set<UInt32>) -> Bool {
            if named.isEmpty { return false }
            if named.contains(gid) { return true }
            if looked == nil { looked = Set(groups()) }
            return !named.isDisjoint(with: looked!)
        }
        let admin = uid == 0 || uid == getuid() || adminUsers.contains(uid) || isMember(of: adminGroups)
        let client = admin || clientUsers.contains(uid) || isMember(of: clientGroups)
        return Grant(store: client, admin: admin, onlyStore: perUnixUserStores && !admin ? String(uid) : nil)
    }

    /// Resolves a user name or numeric uid; nil when unknown.
    public static func resolveUser(_ name: String) -> UInt32? {
        if let number = UInt32(name) { return number }
        guard let entry = getpwnam(name) else { return nil }
        return entry.pointee.pw_uid
    }

    /// Resolves a group name or numeric gid; nil when unknown.
    public static func resolveGroup(_ name: String) -> UInt32? {
        if let number = UInt32(name) { return number }
        guard let entry = getgrnam(name) else { return nil }
        return entry.pointee.gr_gid
    }
}
