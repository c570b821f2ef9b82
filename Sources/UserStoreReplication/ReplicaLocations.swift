import Foundation
import UserStoreCore

/// Where each user's copy lives in the replica, and the files kept beside a store.
package struct ReplicaLocations: Sendable {
    /// `replication.replica`: the replica's URL.
    package let replica: String
    /// With more than one host: each user's bucket and its epoch, which fence the replica paths.
    package let fencing: (any ReplicaFencing)?
    /// The replica itself, looked into for what it holds.
    package let storage: ReplicaStorage
    /// The replica's marker against the data directory's binding: asked before a user the
    /// replica holds nothing of is created (nil in unit tests of the paths).
    package var identity: ReplicaIdentity?
    /// With one host on a `file://` or `s3://` replica: the writer lease, whose epoch the paths carry.
    package var lease: LeaseKeeper?

    /// Where this host replicates `user` to: `<replica>/<ab>/<cd>/<user>/e<epoch>` under the
    /// writer lease's epoch (``LeaseKeeper``); with more than one host
    /// `<replica>/<bucket>/<user>/e<epoch>` (the bucket's epoch now); `<replica>/<ab>/<cd>/<user>`
    /// without either (no lease held yet). Any query (`s3://b/p?endpoint=…`) is
    /// kept at the end.
    package func replicaURL(for user: UserID) -> String {
        replicaLocation(for: user).url
    }

    /// ``replicaURL(for:)`` and the epoch in it (nil without one), read once.
    package func replicaLocation(for user: UserID) -> (url: String, epoch: Int64?) {
        let epoch = fencing.map { $0.epoch(of: user) ?? 0 } ?? lease?.pathEpoch
        return (url(of: user, epoch: epoch), epoch)
    }

    /// `user`'s folder at `epoch`: with one host, epoch 0 is the folder itself (the layout
    /// before the writer lease, read once by a restore).
    package func url(of user: UserID, epoch: Int64?) -> String {
        guard let epoch, fencing != nil || epoch > 0 else { return withSuffix(userFolderSuffix(user)) }
        return withSuffix(userFolderSuffix(user) + "/e\(epoch)")
    }

    /// The folder holding everything replicated for `user` (every epoch, with more than one host).
    package func userFolderSuffix(_ user: UserID) -> String {
        guard let fencing else { return "/" + StoreLayout.hashPrefix(of: user) + "/" + user.rawValue }
        return "/\(fencing.bucket(of: user))/" + user.rawValue
    }

    /// Where a restore of `user` reads: the replica URL; with more than one host the newest
    /// epoch folder that holds data (a host that lost the bucket may still ship to an older
    /// one, which is then never read again once the new owner has written). Nil when the
    /// replica holds nothing of the user (asked with one listing, or a look into the folder). Throws
    /// when the replica cannot be asked.
    ///
    /// "Found nothing" never overrules "known to be there": before answering nil, the
    /// replica's marker is read again (``ReplicaIdentity/confirm(before:)``): an unmounted
    /// folder or an emptied prefix holds nothing either.
    package func restoreURL(for user: UserID) async throws -> String? {
        let found: String?
        if fencing == nil && lease == nil {
            found = try await storage.holdsAnything(userFolderSuffix(user)) ? replicaURL(for: user) : nil
        } else {
            let epoch = try await newestEpochWithData(user)
            try requireNotAboveLease(epoch, user)
            found = epoch.map { url(of: user, epoch: $0) }
        }
        if let found { return found }
        try await identity?.confirm(before: user)
        return nil
    }

    /// Every epoch folder of `user` that holds data, as restore URLs, newest first (a restore
    /// to a point in time tries each); nil without epochs (one host without a lease).
    /// Throws when the replica cannot be asked.
    package func restoreURLsAtAnyEpoch(for user: UserID) async throws -> [String]? {
        guard fencing != nil || lease != nil else { return nil }
        return try await storage.epochsWithData(userFolderSuffix(user), unfenced: fencing == nil).map { url(of: user, epoch: $0) }
    }

    /// With one host: throws when `user`'s copy in the replica is under a newer epoch than the
    /// writer lease this host holds — its lease epoch is behind (a clock stepped back while the
    /// lease object was lost): restoring that copy and writing under a lower epoch would hide
    /// every write from the next restore.
    package func requireNotAboveLease(_ epoch: Int64?, _ user: UserID) throws {
        guard fencing == nil, let epoch, let held = lease?.pathEpoch, epoch > held else { return }
        throw StoreError.replicationUnavailable(user: user, message: "the replica holds the user under epoch \(epoch), above this host's writer-lease epoch \(held); the writer lease's epoch is behind the replica's (a clock set back?): with the clock right, stop the daemon, remove userstore-lease.json from the replica's root and start it again")
    }

    /// The newest epoch folder of `user` in the replica that holds data: with one host, 0 for
    /// a copy in the layout from before the writer lease (directly under the user's folder).
    /// Nil when none does, and with one host and no lease. Throws when the replica cannot be
    /// asked.
    package func newestEpochWithData(_ user: UserID) async throws -> Int64? {
        guard fencing != nil || lease != nil else { return nil }
        return try await storage.newestEpochWithData(userFolderSuffix(user), unfenced: fencing == nil)
    }

    package func withSuffix(_ suffix: String) -> String {
        guard let query = replica.firstIndex(of: "?") else { return replica + suffix }
        var base = String(replica[..<query])
        if base.hasSuffix("/") { base.removeLast() }
        return base + suffix + String(replica[query...])
    }
}
