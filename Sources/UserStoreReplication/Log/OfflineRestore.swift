import Foundation
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol

/// `userstorectl restore USER --from-replica --offline --to PATH`: a user's store written from
/// the replica's log and folded objects to a new file, by the operator's own process — no daemon,
/// no data directory, no lock (docs/replication.md, "Restoring without a daemon"). The same
/// reading as a daemon's restore (``LogRestorer``: fences, tombstones, folds, `quick_check`), with
/// nothing cached: every fence, the user's folds and the log's objects are listed.
package enum OfflineRestore {
    /// Why nothing was written.
    package struct Failure: Error, CustomStringConvertible, Sendable {
        /// The error's name, as the daemon would give it (`ReplicaDamaged`, `ReplicationUnavailable`,
        /// `NoSuchStore`, `StorageFailure`).
        package let name: String
        package let description: String
    }

    /// Writes `user`'s store, as the replica of `settings` holds it (at `timestamp`: as of the
    /// last object made by then), to `path`, which must not exist; `cluster`: the configuration
    /// has a cluster section. Returns what was restored.
    /// An encrypted user's copy is written as it is (encrypted) and checked with its key from
    /// `keyring` (the configuration's encryption section; nil: `StoreKeyMissing`).
    package static func restore(_ user: String, settings: ReplicationSettings, cluster: Bool, to path: String,
                                timestamp: Date?, keyring: StoreKeyring? = nil) async throws(Failure) -> LogRestorer.Restored {
        guard access(path, F_OK) != 0 else {
            throw Failure(name: "StorageFailure", description: "\(path) exists: give a path that does not (nothing is overwritten)")
        }
        let storage: ReplicaStorage
        do {
            storage = try ReplicaStorage(settings)
        } catch {
            throw Failure(name: "ReplicationUnavailable", description: "\(error)")
        }
        let staged = path + ".restoring"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(staged + suffix) } }
        let restored: LogRestorer.Restored?
        do {
            restored = try await LogRestorer(storage: storage, cluster: cluster, keyring: keyring).restore(user, to: staged, timestamp: timestamp)
        } catch let error as StoreError {
            throw Failure(name: String(error.varlinkError.name.split(separator: ".").last ?? ""), description: error.description)
        } catch let damaged as LogSegment.Damaged {
            throw Failure(name: ErrorName.replicaDamaged.short, description: damaged.description)
        } catch {
            throw Failure(name: "ReplicationUnavailable", description: "reading the log: \(error)")
        }
        guard let restored else {
            throw Failure(name: ErrorName.noSuchStore.short, description: "the replica's log holds nothing of \(user)\(timestamp.map { " as of \(RFC3339.format($0))" } ?? "") (a copy in Litestream's layout, from before the log, is read with `litestream restore`: docs/replication.md)")
        }
        do {
            try DurableFile.publishDatabase(staged, as: path)
        } catch {
            throw Failure(name: "StorageFailure", description: "putting the restored copy at \(path): \(error)")
        }
        return restored
    }
}
