import Crypto
import Foundation
import UserStoreCore
import UserStoreS3

/// Small objects at the replica's root that the daemon keeps itself — the replica's marker
/// (``ReplicaMarker``) and the writer lease (``ReplicaLease``) — read and written with
/// compare-and-swap: S3's conditional writes (`If-None-Match: *`, `If-Match`), and in a folder
/// an exclusive `flock` on `.userstore.lock` held across the read, the comparison and the
/// rename (docs/replication.md, "One writer").
extension ReplicaStorage {
    /// An object's bytes and its version: S3's entity tag, or in a folder the SHA-256 of the bytes.
    package struct StoredObject: Sendable, Equatable {
        package var data: Data
        package var version: String
    }

    /// A `file://` replica that is not a usable folder: replaced by a file, unreadable.
    package struct FolderProblem: Error, CustomStringConvertible, Equatable {
        /// `ReplicaNotAFolder`, `ReplicaUnreadable` or `ReplicaMissing`.
        package let name: String
        package let detail: String
        package var description: String { "\(name): \(detail)" }
    }

    /// The folder's lock file (never removed; its name is left out of "what the replica holds").
    static let lockName = ".userstore.lock"

    /// The object `name` at the replica's root; nil when there is none (or the folder does not
    /// exist). Throws when the replica cannot be read.
    package func readObject(_ name: String) async throws -> StoredObject? {
        switch kind {
        case .folder(let root):
            return try await BlockingPool.run {
                guard try Self.folderExists(root) else { return nil }
                guard let data = FileManager.default.contents(atPath: root + "/" + name) else {
                    if access(root + "/" + name, F_OK) != 0 && errno == ENOENT { return nil }
                    throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(root)/\(name): \(String(cString: strerror(errno)))")
                }
                return StoredObject(data: data, version: Self.digest(data))
            }
        case .bucket(let client, let bucket, let prefix):
            return try await client.getObject(bucket: bucket, key: Self.key(prefix, "/" + name)).map { StoredObject(data: $0.body, version: $0.etag) }
        }
    }

    /// Writes `data` as `name` at the replica's root when `condition` holds of what is there, and
    /// returns its new version; nil when the condition does not hold. A folder that does not
    /// exist is made first only for `.absent` (a new replica's marker).
    package func writeObject(_ name: String, _ data: Data, condition: S3Client.WriteCondition) async throws -> String? {
        switch kind {
        case .folder(let root):
            return try await BlockingPool.run {
                if case .absent = condition, try !Self.folderExists(root) {
                    try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
                }
                return try Self.withFolderLock(root) {
                    let current = FileManager.default.contents(atPath: root + "/" + name)
                    switch condition {
                    case .none: break
                    case .absent: if current != nil { return nil }
                    case .matching(let version): if current.map(Self.digest) != version { return nil }
                    }
                    try Self.writeDurably(data, to: root + "/" + name)
                    return Self.digest(data)
                }
            }
        case .bucket(let client, let bucket, let prefix):
            guard let etag = try await client.putObject(bucket: bucket, key: Self.key(prefix, "/" + name), body: data, condition: condition) else { return nil }
            // A server that sends no ETag: a single-part object's is the quoted MD5 of its bytes.
            return etag.isEmpty ? "\"" + Insecure.MD5.hash(data: data).map { String(format: "%02x", $0) }.joined() + "\"" : etag
        }
    }

    /// Removes the object `name` at the replica's root (nothing happens when there is none).
    package func deleteObject(_ name: String) async throws {
        switch kind {
        case .folder(let root):
            try await BlockingPool.run {
                if unlink(root + "/" + name) != 0 && errno != ENOENT {
                    throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot remove \(root)/\(name): \(String(cString: strerror(errno)))")
                }
            }
        case .bucket(let client, let bucket, let prefix):
            try await client.deleteObject(bucket: bucket, key: Self.key(prefix, "/" + name))
        }
    }

    /// Whether the replica refuses a conditional write whose condition does not hold — what the
    /// marker and the writer lease stand on. An S3 server that ignores `If-Match` and
    /// `If-None-Match` on PUT would let two hosts both take the lease. Three requests on a
    /// scratch object, removed after. Throws when the replica does not answer.
    package func refusesFailedConditions() async throws -> Bool {
        guard case .bucket = kind else { return true } // a folder: the daemon's own flock
        let name = ".userstore-probe-\(UUID().uuidString.lowercased())"
        guard try await writeObject(name, Data("probe".utf8), condition: .none) != nil else { return false }
        let mismatch: String?, taken: String?
        do {
            mismatch = try await writeObject(name, Data("mismatch".utf8), condition: .matching("\"00000000000000000000000000000000\""))
            taken = try await writeObject(name, Data("taken".utf8), condition: .absent)
        } catch {
            try? await deleteObject(name)
            throw error
        }
        try? await deleteObject(name)
        return mismatch == nil && taken == nil
    }

    /// Whether the replica holds anything besides the objects named in `ours` (and a folder's
    /// lock file). One listing.
    package func holdsAnything(besides ours: Set<String>) async throws -> Bool {
        switch kind {
        case .folder(let root):
            return try await BlockingPool.run {
                guard try Self.folderExists(root) else { return false }
                let names = try FileManager.default.contentsOfDirectory(atPath: root)
                return names.contains { !ours.contains($0) && $0 != Self.lockName && !$0.hasPrefix(".userstore-") }
            }
        case .bucket(let client, let bucket, let prefix):
            let root = prefix.isEmpty ? "" : prefix + "/"
            return try await client.firstKeys(bucket: bucket, prefix: root, count: ours.count + 1).contains { key in
                let name = String(key.dropFirst(root.count))
                return !ours.contains(name) && !name.hasPrefix(".userstore-")
            }
        }
    }

    /// Whether the folder `root` exists; throws when something else is there (a file where the
    /// replica's folder should be) or it cannot be looked at.
    static func folderExists(_ root: String) throws -> Bool {
        var status = stat()
        guard stat(root, &status) == 0 else {
            if errno == ENOENT { return false }
            throw FolderProblem(name: errno == ENOTDIR ? "ReplicaNotAFolder" : "ReplicaUnreadable",
                                detail: "\(root): \(String(cString: strerror(errno)))")
        }
        guard status.st_mode & S_IFMT == S_IFDIR else {
            throw FolderProblem(name: "ReplicaNotAFolder", detail: "\(root) is not a folder")
        }
        return true
    }

    /// Runs `body` holding an exclusive `flock` on the folder's lock file: Linux maps it to a
    /// byte-range lock on NFS, so hosts sharing the folder over NFSv4 exclude each other too.
    /// Gives up after 10 s (a host holding it that long is hung).
    static func withFolderLock<T>(_ root: String, _ body: () throws -> T) throws -> T {
        let path = root + "/" + lockName
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(descriptor) } // releases the lock too
        let deadline = ContinuousClock.now + .seconds(10)
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR, ContinuousClock.now < deadline else {
                throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot lock \(path): \(errno == EWOULDBLOCK ? "held by another process for 10 s" : String(cString: strerror(errno)))")
            }
            usleep(10_000)
        }
        return try body()
    }

    /// Writes `data` to `path` durably: a temporary file beside it, fsync, rename, fsync of the folder.
    static func writeDurably(_ data: Data, to path: String) throws {
        let folder = (path as NSString).deletingLastPathComponent
        let temporary = folder + "/.userstore-\(UUID().uuidString).tmp"
        let failed = { (step: String, file: String) in
            FolderProblem(name: "ReplicaUnreadable", detail: "cannot \(step) \(file): \(String(cString: strerror(errno)))")
        }
        guard FileManager.default.createFile(atPath: temporary, contents: data) else { throw failed("write", temporary) }
        guard sync(temporary, flags: O_RDONLY), rename(temporary, path) == 0 else {
            let problem = failed("sync and rename", temporary)
            unlink(temporary)
            throw problem
        }
        guard sync(folder, flags: O_RDONLY | O_DIRECTORY) else { throw failed("sync", folder) }
    }

    private static func sync(_ path: String, flags: Int32) -> Bool {
        let descriptor = open(path, flags | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return fsync(descriptor) == 0
    }

    static func digest(_ data: Data) -> String {
        SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
    }
}
