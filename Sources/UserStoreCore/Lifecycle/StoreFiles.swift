import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What deleting a store removed.
public struct DeletionReport: Sendable, Equatable {
    /// The user had a store file.
    public var existed: Bool
    /// Every file removed (the store, its WAL, its backups unless kept), as paths.
    public var removedFiles: [String]
}

/// The files of one store as a whole, crash-safely: deleting them all, and putting a prepared
/// file in place as the store. Runs only while nobody has the store open
/// (``StoreRegistry/withStoreClosed(_:_:)``).
///
/// - A deletion writes a marker (`<data>/deleting/<user>`) before it removes anything and
///   removes the marker last; ``recoverInterruptedOperations()`` finishes any deletion a crash
///   cut short before the daemon serves, so after a crash a store is either whole or gone.
/// - A new store file (import, restore) is prepared under `<data>/staging/`, synced, and renamed
///   over the store's path: the old file or the new one, never a mix. The store's WAL is gone
///   by then (a store closes with a checkpoint), so no old WAL can meet a new file.
struct StoreFiles: Sendable {
    let layout: StoreLayout

    /// The files that make up `user`'s store beside the database: its journals.
    private func storeFiles(_ user: UserID) -> [String] {
        let path = layout.storePath(for: user)
        // Copies set aside when another host's newer copy replaced them (``setAside(_:tag:)``).
        let name = URL(fileURLWithPath: path).lastPathComponent
        let aside = ((try? FileManager.default.contentsOfDirectory(atPath: layout.storeDirectory(for: user))) ?? [])
            .filter { $0.hasPrefix(name + ".superseded-") }
            .map { layout.storeDirectory(for: user) + "/" + $0 }
        return [path, path + "-wal", path + "-shm", path + "-journal"] + aside
    }

    /// Every file of `user` that a deletion removes.
    func files(of user: UserID, keepBackups: Bool) -> [String] {
        var files = storeFiles(user).filter { FileManager.default.fileExists(atPath: $0) }
        if !keepBackups { files += BackupKeeper(layout: layout).files(of: user).map(\.path) }
        return files
    }

    /// Removes every file of `user`'s store (and its backups unless `keepBackups`), behind a
    /// durable marker so that a crash half-way is finished at the next start.
    func delete(_ user: UserID, keepBackups: Bool) throws -> DeletionReport {
        let existed = FileManager.default.fileExists(atPath: layout.storePath(for: user))
        let files = files(of: user, keepBackups: keepBackups)
        guard !files.isEmpty else { return DeletionReport(existed: existed, removedFiles: []) }
        let marker = layout.deletingDirectory + "/" + user.rawValue
        do {
            try FileManager.default.createDirectory(atPath: layout.deletingDirectory, withIntermediateDirectories: true)
            try DurableFile.write(keepBackups ? "keep-backups\n" : "all\n", to: marker)
            let removed = try DurableFile.remove(files)
            _ = try DurableFile.remove([marker])
            return DeletionReport(existed: existed, removedFiles: removed)
        } catch {
            throw StoreError.storageFailure(user: user, message: "deleting the store: \(error)")
        }
    }

    /// Finishes deletions a crash interrupted and removes half-prepared imports and restores.
    /// Run before anything opens a store.
    func recoverInterruptedOperations() throws -> [UserID] {
        var finished: [UserID] = []
        let markers = (try? FileManager.default.contentsOfDirectory(atPath: layout.deletingDirectory)) ?? []
        for name in markers.sorted() {
            let marker = layout.deletingDirectory + "/" + name
            guard let user = try? UserID(name) else {
                unlink(marker) // a marker's own temporary file (".partial")
                continue
            }
            let keepBackups = (try? String(contentsOfFile: marker, encoding: .utf8))?.hasPrefix("keep-backups") ?? false
            _ = try DurableFile.remove(files(of: user, keepBackups: keepBackups))
            _ = try DurableFile.remove([marker])
            finished.append(user)
        }
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: layout.stagingDirectory)) ?? []
        _ = try DurableFile.remove(staged.map { layout.stagingDirectory + "/" + $0 })
        return finished
    }

    /// A new path in the staging folder for a file being prepared for `user`.
    func stagingPath(for user: UserID) throws -> String {
        try FileManager.default.createDirectory(atPath: layout.stagingDirectory, withIntermediateDirectories: true)
        return layout.stagingDirectory + "/" + user.rawValue + "." + UUID().uuidString.lowercased() + ".sqlite"
    }

    /// Makes the prepared file at `staged` `user`'s store, replacing the current one: synced,
    /// renamed over the store's path, folder synced. The store must be closed (no WAL).
    func publish(_ staged: String, as user: UserID) throws {
        let path = layout.storePath(for: user)
        do {
            try FileManager.default.createDirectory(atPath: layout.storeDirectory(for: user), withIntermediateDirectories: true)
            try DurableFile.publishDatabase(staged, as: path)
        } catch {
            throw StoreError.storageFailure(user: user, message: "publishing \(staged): \(error)")
        }
    }
}

extension StoreFiles {
    /// Renames the store file at `path` and its `-wal` and `-shm` to `<path>.<tag>…` (SQLite
    /// still finds the WAL of the renamed file); returns the new path. The names are kept out
    /// of every store listing by their suffix.
    static func setAside(_ path: String, tag: String) throws -> String {
        let aside = path + "." + tag
        for suffix in ["-wal", "-shm", ""] where FileManager.default.fileExists(atPath: path + suffix) {
            guard rename(path + suffix, aside + suffix) == 0 else {
                throw StoreError.storageFailure(user: try UserID(URL(fileURLWithPath: path).deletingPathExtension().lastPathComponent),
                                                message: "setting \(path + suffix) aside: \(String(cString: strerror(errno)))")
            }
        }
        return aside
    }
}

