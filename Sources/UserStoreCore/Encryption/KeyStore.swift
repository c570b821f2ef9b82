import Foundation

/// Where the wrapped data keys live, apart from the data (docs/encryption.md, "The key store"):
/// one small record per user, and one that checks the key-encryption key.
public protocol KeyStore: Sendable {
    /// The record `name`; nil when there is none.
    func read(_ name: String) async throws -> [UInt8]?
    /// Writes `bytes` as the record `name`, replacing any, durably: once it returns, the record
    /// survives a crash.
    func write(_ name: String, _ bytes: [UInt8]) async throws
    /// Removes the record `name` (nothing when there is none), durably.
    func remove(_ name: String) async throws
    /// The names of every record under `folder` (`users/`), in no order.
    func names(under folder: String) async throws -> [String]
    /// Where the records are, for messages (`file:///var/lib/userstore-keys`).
    var location: String { get }
}

/// A key store in a folder (`encryption.keyStore: file:///path`): a file per record, written with
/// ``DurableFile`` (a temporary file, fsync, rename, fsync of the folder), on the blocking pool
/// (``BlockingPool/run(_:)``: in place when the caller is on it already). Keep the folder on
/// another disk than the data directory, or the key goes wherever the data goes.
public struct FolderKeyStore: KeyStore {
    public let root: String

    public init(root: String) {
        self.root = root
    }

    public var location: String { "file://" + root }

    /// A record that cannot be read or written: the path and why.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    public func read(_ name: String) async throws -> [UInt8]? {
        try await BlockingPool.run { [root] in try Self.read(root + "/" + name) }
    }

    private static func read(_ path: String) throws -> [UInt8]? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            if errno == ENOENT { return nil }
            throw Failure(description: "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(descriptor) }
        var bytes: [UInt8] = [], chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            guard count >= 0 else { throw Failure(description: "cannot read \(path): \(String(cString: strerror(errno)))") }
            if count == 0 { return bytes }
            bytes += chunk[0..<count]
        }
    }

    public func write(_ name: String, _ bytes: [UInt8]) async throws {
        try await BlockingPool.run { try writeNow(name, bytes) }
    }

    private func writeNow(_ name: String, _ bytes: [UInt8]) throws {
        // Folders are made below the root, never the root itself: a root that is gone is an
        // unmounted or mistyped key store, not a place to start a new one.
        var status = stat()
        guard stat(root, &status) == 0, status.st_mode & S_IFMT == S_IFDIR else {
            throw Failure(description: "the key store's folder \(root) is missing or not a folder (not mounted? create it with mkdir -m 700)")
        }
        let path = root + "/" + name
        let folder = (path as NSString).deletingLastPathComponent
        if !FileManager.default.fileExists(atPath: folder) {
            do {
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw Failure(description: "cannot create \(folder): \((error as NSError).localizedDescription)")
            }
        }
        try DurableFile.write(bytes, to: path)
    }

    public func remove(_ name: String) async throws {
        _ = try await BlockingPool.run { [root] in try DurableFile.remove([root + "/" + name]) }
    }

    public func names(under folder: String) async throws -> [String] {
        try await BlockingPool.run { try namesNow(under: folder) }
    }

    private func namesNow(under folder: String) throws -> [String] {
        let base = root + "/" + folder
        guard FileManager.default.fileExists(atPath: base) else { return [] }
        guard let walker = FileManager.default.enumerator(atPath: base) else { throw Failure(description: "cannot list \(base)") }
        var names: [String] = []
        while let name = walker.nextObject() as? String {
            // A record being written (DurableFile's temporary files) is not one yet.
            if walker.fileAttributes?[.type] as? FileAttributeType == .typeRegular, !name.contains(".partial-") { names.append(folder + name) }
        }
        return names
    }
}
