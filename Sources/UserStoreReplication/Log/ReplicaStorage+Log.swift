import Foundation
import UserStoreCore
import UserStoreS3

/// The host log's objects in the replica, by key (a path under the replica's root, `/`-separated):
/// written whole, read whole or by their first bytes, listed and deleted. A bucket is asked on
/// the S3 client's own loop, with no thread blocked for it; a folder is read and written on a
/// blocking-pool thread.
extension ReplicaStorage {
    /// Writes `bytes` as `key` (an object written whole: a folder gets a file synced and renamed
    /// into place, its folders made as needed).
    package func put(_ key: String, _ bytes: [UInt8]) async throws {
        switch kind {
        case .folder(let root):
            try await BlockingPool.run {
                // Folders are made below the replica's root, never the root itself: a root that is
                // gone is an unmounted or removed replica, not a place to start writing (replicagone).
                var status = stat()
                guard stat(root, &status) == 0, status.st_mode & S_IFMT == S_IFDIR else {
                    throw FolderProblem(name: "ReplicaMissing", detail: "the replica's folder \(root) is gone or is not a folder")
                }
                let path = root + "/" + key
                try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
                try Self.writeDurably(Data(bytes), to: path)
            }
        case .bucket(let client, let bucket, let prefix):
            _ = try await client.putObject(bucket: bucket, key: Self.key(prefix, "/" + key), body: Data(bytes))
        }
    }

    /// The object `key`, whole; nil when there is none.
    package func get(_ key: String) async throws -> [UInt8]? {
        switch kind {
        case .folder(let root):
            return try await BlockingPool.run {
                let path = root + "/" + key
                guard let data = FileManager.default.contents(atPath: path) else {
                    if access(path, F_OK) != 0 && errno == ENOENT { return nil }
                    throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))")
                }
                return Array(data)
            }
        case .bucket(let client, let bucket, let prefix):
            return try await client.getObject(bucket: bucket, key: Self.key(prefix, "/" + key)).map { Array($0.body) }
        }
    }

    /// The first `bytes` bytes of the object `key` (fewer when it is shorter); nil when there is none.
    package func getPrefix(_ key: String, bytes: Int) async throws -> [UInt8]? {
        switch kind {
        case .folder(let root):
            return try await BlockingPool.run {
                let path = root + "/" + key
                let descriptor = open(path, O_RDONLY | O_CLOEXEC)
                guard descriptor >= 0 else {
                    if errno == ENOENT { return nil }
                    throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))")
                }
                defer { close(descriptor) }
                var buffer = [UInt8](repeating: 0, count: bytes)
                let read = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, bytes, 0) }
                guard read >= 0 else { throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))") }
                return Array(buffer.prefix(read))
            }
        case .bucket(let client, let bucket, let prefix):
            return try await client.getObject(bucket: bucket, key: Self.key(prefix, "/" + key), range: 0..<bytes).map { Array($0.body) }
        }
    }

    /// Every key under `folder` (`a/b/`), relative to the replica's root, sorted.
    package func keys(under folder: String) async throws -> [String] {
        switch kind {
        case .folder(let root):
            return await BlockingPool.run {
                guard let enumerator = FileManager.default.enumerator(atPath: root + "/" + folder) else { return [] }
                var keys: [String] = []
                while let name = enumerator.nextObject() as? String {
                    if enumerator.fileAttributes?[.type] as? FileAttributeType == .typeRegular, !(name as NSString).lastPathComponent.hasPrefix(".") {
                        keys.append(folder + name)
                    }
                }
                return keys.sorted()
            }
        case .bucket(let client, let bucket, let prefix):
            let root = prefix.isEmpty ? "" : prefix + "/"
            return try await client.list(bucket: bucket, prefix: Self.key(prefix, "/" + folder)).keys.map { String($0.dropFirst(root.count)) }.sorted()
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
    package func delete(_ keys: [String]) async throws {
        switch kind {
        case .folder(let root):
            try await BlockingPool.run {
                for key in keys where unlink(root + "/" + key) != 0 && errno != ENOENT {
                    throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot remove \(root)/\(key): \(String(cString: strerror(errno)))")
                }
            }
        case .bucket(let client, let bucket, let prefix):
            try await client.delete(bucket: bucket, keys: keys.map { Self.key(prefix, "/" + $0) })
        }
    }
}
