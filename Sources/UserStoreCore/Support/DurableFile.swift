import Foundation

/// Puts a finished temporary file under its final name durably and atomically: fsync of the
/// file, rename, fsync of the folder. A crash leaves either nothing at the final name or the
/// whole file. Used for new stores copied from the template and for backups.
enum DurableFile {
    /// Which step failed, on which path, and why (errno).
    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ step: String, _ path: String) { description = "\(step) \(path): \(String(cString: strerror(errno)))" }
    }

    /// Syncs `temporary`, renames it to `path`, syncs `path`'s folder. Deletes `temporary` when
    /// a step fails.
    static func publish(_ temporary: String, as path: String) throws(Failure) {
        do throws(Failure) {
            try sync(temporary, flags: O_RDONLY)
            guard rename(temporary, path) == 0 else { throw Failure("rename", temporary) }
        } catch {
            unlink(temporary)
            throw error
        }
        try sync((path as NSString).deletingLastPathComponent, flags: O_RDONLY | O_DIRECTORY)
    }

    private static func sync(_ path: String, flags: Int32) throws(Failure) {
        let descriptor = open(path, flags | O_CLOEXEC)
        guard descriptor >= 0 else { throw Failure("open", path) }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else { throw Failure("fsync", path) }
    }
}
