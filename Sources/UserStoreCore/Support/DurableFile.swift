import Foundation

/// Puts a finished temporary file under its final name durably and atomically: fsync of the
/// file, rename, fsync of the folder. A crash leaves either nothing at the final name or the
/// whole file. Used for new stores copied from the template, backups and restored replicas.
public enum DurableFile {
    /// Which step failed, on which path, and why (errno).
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        init(_ step: String, _ path: String) { description = "\(step) \(path): \(String(cString: strerror(errno)))" }
    }

    /// Syncs `temporary`, renames it to `path`, syncs `path`'s folder. Deletes `temporary` when
    /// a step fails.
    public static func publish(_ temporary: String, as path: String) throws(Failure) {
        do throws(Failure) {
            try sync(temporary, flags: O_RDONLY)
            guard rename(temporary, path) == 0 else { throw Failure("rename", temporary) }
        } catch {
            unlink(temporary)
            throw error
        }
        try sync((path as NSString).deletingLastPathComponent, flags: O_RDONLY | O_DIRECTORY)
    }

    /// ``publish(_:as:)`` for a SQLite file replacing another: the old file's `-wal`, `-shm` and
    /// `-journal` are removed first, so that SQLite never applies them to the new file.
    public static func publishDatabase(_ temporary: String, as path: String) throws(Failure) {
        _ = try remove([path + "-wal", path + "-shm", path + "-journal"])
        try publish(temporary, as: path)
    }

    /// Syncs the folder `path` (after files in it were created, renamed or removed).
    static func syncDirectory(_ path: String) throws(Failure) {
        try sync(path, flags: O_RDONLY | O_DIRECTORY)
    }

    /// Writes `contents` to a new file at `path` and makes it durable (file and folder synced).
    /// Two writers of one path at once each write a temporary file of their own; the last
    /// rename wins.
    public static func write(_ contents: String, to path: String) throws(Failure) {
        try write(Array(contents.utf8), to: path)
    }

    /// ``write(_:to:)-(String,_)`` for bytes.
    public static func write(_ bytes: [UInt8], to path: String) throws(Failure) {
        let temporary = path + ".partial-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw Failure("open", temporary) }
        let written = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
        close(descriptor)
        guard written == bytes.count else { unlink(temporary); throw Failure("write", temporary) }
        try publish(temporary, as: path)
    }

    /// Removes `paths` (those that exist) and syncs their folders; returns the ones removed.
    package static func remove(_ paths: [String]) throws(Failure) -> [String] {
        var removed: [String] = []
        var folders: Set<String> = []
        for path in paths {
            if unlink(path) == 0 {
                removed.append(path)
                folders.insert((path as NSString).deletingLastPathComponent)
            } else if errno != ENOENT {
                throw Failure("unlink", path)
            }
        }
        for folder in folders.sorted() { try syncDirectory(folder) }
        return removed
    }

    private static func sync(_ path: String, flags: Int32) throws(Failure) {
        let descriptor = open(path, flags | O_CLOEXEC)
        guard descriptor >= 0 else { throw Failure("open", path) }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else { throw Failure("fsync", path) }
    }
}
