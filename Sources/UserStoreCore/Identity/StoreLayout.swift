import Crypto
import Foundation

/// Where every file of the data directory lives. Paths are pure functions of their inputs.
///
/// ```
/// <dataDirectory>/userstore.lock                      cross-process lock (DataDirectoryLock)
/// <dataDirectory>/stores/ab/cd/<userID>.sqlite        one store per user
/// <dataDirectory>/backups/ab/<userID>.v3.<time>.<reason>.sqlite      copies of the store
/// <dataDirectory>/staging/                            imports and restores being prepared
/// <dataDirectory>/deleting/<userID>                   deletions under way
/// <dataDirectory>/replica.json                        which replica this directory replicates to
/// ```
/// `ab/cd` are the first two bytes of SHA-256(userID) in hex: 65,536 folders, so a million users
/// put about fifteen files in each, and `find -name '<userID>.sqlite'` still finds a store.
/// Backups use one level (`ab`, 256 folders): a fleet migration that copies every store then
/// creates 256 folders instead of one per store. Copies kept in `backups/ab/cd/` by earlier
/// versions are still listed, restored, pruned and deleted.
public struct StoreLayout: Sendable, Equatable {
    /// The absolute data directory.
    public let dataDirectory: String

    /// File suffix of every store.
    public static let storeSuffix = ".sqlite"

    public init(dataDirectory: String) {
        self.dataDirectory = dataDirectory.count > 1 && dataDirectory.hasSuffix("/")
            ? String(dataDirectory.dropLast()) : dataDirectory
    }

    /// Folder holding every store's hash-prefix tree.
    public var storesDirectory: String { dataDirectory + "/stores" }
    /// Folder holding the pre-migration copies.
    public var backupsDirectory: String { dataDirectory + "/backups" }
    /// Scratch space for building the new-store template (see `StoreTemplate`).
    public var templatesDirectory: String { dataDirectory + "/templates" }
    /// Files being imported or restored, until they are published as a store (anything left
    /// there by a crash is removed at start-up).
    public var stagingDirectory: String { dataDirectory + "/staging" }
    /// One marker per store being deleted, written before its first file is removed, so a
    /// deletion cut short by a crash is finished at start-up.
    public var deletingDirectory: String { dataDirectory + "/deleting" }
    /// The cross-process lock file.
    public var lockPath: String { dataDirectory + "/userstore.lock" }
    /// Which replica this data directory replicates to, and the directory's own ID (the
    /// replication's writer lease names it): `ReplicaBinding`.
    public var replicaBindingPath: String { dataDirectory + "/replica.json" }

    /// `ab/cd` for `user`.
    public static func hashPrefix(of user: UserID) -> String {
        let digest = SHA256.hash(data: Array(user.rawValue.utf8))
        var bytes = digest.makeIterator()
        let first = bytes.next()!, second = bytes.next()!
        return hex(first) + "/" + hex(second)
    }

    /// The folder that holds `user`'s store.
    public func storeDirectory(for user: UserID) -> String {
        storesDirectory + "/" + Self.hashPrefix(of: user)
    }

    /// The store file of `user`.
    public func storePath(for user: UserID) -> String {
        storeDirectory(for: user) + "/" + user.rawValue + Self.storeSuffix
    }

    /// The folder that new backups of `user` go to.
    public func backupDirectory(for user: UserID) -> String {
        backupsDirectory + "/" + Self.hashPrefix(of: user).prefix(2)
    }

    /// Every folder that may hold backups of `user`: ``backupDirectory(for:)``, then the
    /// two-level folder earlier versions wrote to.
    public func backupDirectories(for user: UserID) -> [String] {
        [backupDirectory(for: user), backupsDirectory + "/" + Self.hashPrefix(of: user)]
    }

    /// Every user that has a store, in no particular order. Skips files that are not stores
    /// (`-wal`, `-shm`, stray names) so that a damaged tree never stops a listing.
    public func allUsers() -> [UserID] {
        var users: [UserID] = []
        let fileManager = FileManager.default
        guard let level1 = try? fileManager.contentsOfDirectory(atPath: storesDirectory) else { return [] }
        for first in level1 where first.utf8.count == 2 {
            let firstPath = storesDirectory + "/" + first
            guard let level2 = try? fileManager.contentsOfDirectory(atPath: firstPath) else { continue }
            for second in level2 where second.utf8.count == 2 {
                let secondPath = firstPath + "/" + second
                guard let files = try? fileManager.contentsOfDirectory(atPath: secondPath) else { continue }
                for file in files where file.hasSuffix(Self.storeSuffix) {
                    if let user = try? UserID(String(file.dropLast(Self.storeSuffix.count))) {
                        users.append(user)
                    }
                }
            }
        }
        return users
    }

    /// Whether any store file is under the stores folder: stops at the first one found (a
    /// replica that is empty while this returns true is what an unmounted replica looks like).
    public func holdsAnyStore() -> Bool {
        let fileManager = FileManager.default
        guard let level1 = try? fileManager.contentsOfDirectory(atPath: storesDirectory) else { return false }
        for first in level1 where first.utf8.count == 2 {
            guard let level2 = try? fileManager.contentsOfDirectory(atPath: storesDirectory + "/" + first) else { continue }
            for second in level2 where second.utf8.count == 2 {
                let files = (try? fileManager.contentsOfDirectory(atPath: storesDirectory + "/" + first + "/" + second)) ?? []
                if files.contains(where: { $0.hasSuffix(Self.storeSuffix) }) { return true }
            }
        }
        return false
    }

    private static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
    }
}
