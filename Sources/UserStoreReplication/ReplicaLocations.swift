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
    /// Which users the bucket holds (one host, `s3://`), once listed.
    package let replicaIndex: ReplicaIndex

    /// Where this host replicates `user` to: `<replica>/<ab>/<cd>/<user>`; with more than one
    /// host `<replica>/<bucket>/<user>/e<epoch>` (the bucket's epoch now). Any query
    /// (`s3://b/p?endpoint=…`) is kept at the end.
    package func replicaURL(for user: UserID) -> String {
        replicaLocation(for: user).url
    }

    /// ``replicaURL(for:)`` and the epoch in it (nil with one host), read once.
    package func replicaLocation(for user: UserID) -> (url: String, epoch: Int64?) {
        guard let fencing else { return (withSuffix(userFolderSuffix(user)), nil) }
        let epoch = fencing.epoch(of: user) ?? 0
        return (withSuffix(userFolderSuffix(user) + "/e\(epoch)"), epoch)
    }

    /// The folder holding everything replicated for `user` (every epoch, with more than one host).
    package func userFolderSuffix(_ user: UserID) -> String {
        guard let fencing else { return "/" + StoreLayout.hashPrefix(of: user) + "/" + user.rawValue }
        return "/\(fencing.bucket(of: user))/" + user.rawValue
    }

    /// Where a restore of `user` reads: the replica URL; with more than one host the newest
    /// epoch folder that holds data (a host that lost the bucket may still ship to an older
    /// one, which is then never read again once the new owner has written). Nil when the
    /// replica holds nothing of the user (asked with one listing, or a look into the folder;
    /// an `sftp://` replica, which the daemon cannot look into, is left to Litestream). Throws
    /// when the replica cannot be asked. Blocking.
    package func restoreURL(for user: UserID) throws -> String? {
        guard fencing != nil else {
            // The index, once listed, answers without a request (one host only).
            if replicaIndex.holds(user.rawValue) == false { return nil }
            guard try storage.holdsAnything(userFolderSuffix(user)) != false else { return nil }
            replicaIndex.insert(user.rawValue)
            return replicaURL(for: user)
        }
        guard let epoch = try newestEpochWithData(user) else {
            // Nothing in any epoch, as far as the daemon can see (an sftp replica: Litestream looks).
            return storage.canList ? nil : replicaURL(for: user)
        }
        return withSuffix(userFolderSuffix(user) + "/e\(epoch)")
    }

    /// The newest epoch folder of `user` in the replica that holds data (more than one host).
    /// Throws when the replica cannot be asked. Blocking.
    package func newestEpochWithData(_ user: UserID) throws -> Int64? {
        guard fencing != nil else { return nil }
        return try storage.newestEpochWithData(userFolderSuffix(user))
    }

    package func withSuffix(_ suffix: String) -> String {
        guard let query = replica.firstIndex(of: "?") else { return replica + suffix }
        var base = String(replica[..<query])
        if base.hasSuffix("/") { base.removeLast() }
        return base + suffix + String(replica[query...])
    }

    /// Litestream's state folder beside a store (`.<name>-litestream`).
    package static func sidecar(of path: String) -> String {
        let url = URL(fileURLWithPath: path)
        return url.deletingLastPathComponent().path + "/." + url.lastPathComponent + "-litestream"
    }

    /// The epoch this host last replicated the store at `path` under (more than one host),
    /// beside the store: a later open compares it with the replica's newest epoch.
    package static func epochFile(of path: String) -> String {
        let url = URL(fileURLWithPath: path)
        return url.deletingLastPathComponent().path + "/." + url.lastPathComponent + "-epoch"
    }
}
