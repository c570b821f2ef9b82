import Foundation
import UserStoreCore
import UserStoreS3

/// The host log's objects in the replica, by key (a path under the replica's root, `/`-separated):
/// written whole, read whole or by their first bytes, listed and deleted. Blocking (the log's
/// uploader and readers call them on the blocking pool).
extension ReplicaStorage {
    /// ``put(_:_:)`` from async code: a bucket is written on the S3 client's own loop, with no
    /// thread blocked for it (every durable write waits on this); a folder on a blocking-pool
    /// thread.
    package func putAsync(_ key: String, _ bytes: [UInt8]) async throws {
        guard case .bucket(let client, let bucket, let prefix) = kind else { return try await BlockingPool.run { try put(key, bytes) } }
        _ = try await client.putObject(bucket: bucket, key: Self.key(prefix, "/" + key), body: Data(bytes))
    }

    /// Writes `bytes` as `key` (an object written whole: a folder gets a file synced and renamed
    /// into place, its folders made as needed). Blocking.
    package func put(_ key: String, _ bytes: [UInt8]) throws {
        switch kind {
        case .folder(let root):
            // Folders are made below the replica's root, never the root itself: a root that is
            // gone is an unmounted or removed replica, not a place to start writing (replicagone).
            var status = stat()
            guard stat(root, &status) == 0, status.st_mode & S_IFMT == S_IFDIR else {
                throw FolderProblem(name: "ReplicaMissing", detail: "the replica's folder \(root) is gone or is not a folder")
            }
            let path = root + "/" + key
            try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Self.writeDurably(Data(bytes), to: path)
        case .bucket(let client, let bucket, let prefix):
            let full = Self.key(prefix, "/" + key)
            _ = try BlockingPool.wait { try await client.putObject(bucket: bucket, key: full, body: Data(bytes)) }
        }
    }

    /// The object `key`, whole; nil when there is none.
    package func get(_ key: String) throws -> [UInt8]? {
        switch kind {
        case .folder(let root):
            let path = root + "/" + key
            guard let data = FileManager.default.contents(atPath: path) else {
                if access(path, F_OK) != 0 && errno == ENOENT { return nil }
                throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            return Array(data)
        case .bucket(let client, let bucket, let prefix):
            let full = Self.key(prefix, "/" + key)
            return try BlockingPool.wait { try await client.getObject(bucket: bucket, key: full) }.map { Array($0.body) }
        }
    }

    /// Every key under `folder` (`a/b/`), relative to the replica's root, sorted.
    package func keys(under folder: String) throws -> [String] {
        switch kind {
        case .folder(let root):
            guard let enumerator = FileManager.default.enumerator(atPath: root + "/" + folder) else { return [] }
            var keys: [String] = []
            while let name = enumerator.nextObject() as? String {
                if enumerator.fileAttributes?[.type] as? FileAttributeType == .typeRegular, !(name as NSString).lastPathComponent.hasPrefix(".") {
                    keys.append(folder + name)
                }
            }
            return keys.sorted()
        case .bucket(let client, let bucket, let prefix):
            let full = Self.key(prefix, "/" + folder)
            let root = prefix.isEmpty ? "" : prefix + "/"
            return try BlockingPool.wait { try await client.list(bucket: bucket, prefix: full).keys }.map { String($0.dropFirst(root.count)) }.sorted()
        }
    }

    /// Where the folder `folder` is, for an operator (`file:///…/log/`, `s3://bucket/prefix/log/`).
    package func describe(_ folder: String) -> String {
        switch kind {
        case .folder(let root): "file://" + root + "/" + folder
        case .bucket(_, let bucket, let prefix): "s3://" + bucket + "/" + Self.key(prefix, "/" + folder)
        }
    }

    /// Deletes the objects `keys` (those that exist).
    package func delete(_ keys: [String]) throws {
        switch kind {
        case .folder(let root):
            for key in keys where unlink(root + "/" + key) != 0 && errno != ENOENT {
                throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot remove \(root)/\(key): \(String(cString: strerror(errno)))")
            }
        case .bucket(let client, let bucket, let prefix):
            let full = keys.map { Self.key(prefix, "/" + $0) }
            try BlockingPool.wait { try await client.delete(bucket: bucket, keys: full) }
        }
    }
}
