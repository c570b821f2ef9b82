/// Which of the loaded migrations a store may be migrated to now — the staged rollout of a
/// release (``Release/allowedVersions(for:)``). Asked whenever a store is about to be
/// migrated, lazily or by a fleet run; never on the request path of a ready store.
public protocol MigrationGate: Sendable {
    /// The versions `user`'s store may be migrated to; nil: every loaded one. A store already
    /// past them is served as it is.
    func allowedVersions(for user: UserID) -> Set<Int64>?
}
