import UserStoreConfiguration
import Foundation
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// Prepares the path of a socket the daemon binds itself.
enum SocketBinder {
    /// Why the socket path cannot be used.
    struct PathError: Error, CustomStringConvertible {
        let path: String
        let problem: String
        var description: String { "socket \(path): \(problem)" }
    }

    /// Creates the socket's folder and removes a stale socket left by a crashed daemon. Refuses
    /// to touch a socket another process still serves, and any file that is not a socket.
    static func prepare(_ path: String) throws {
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent().path
        do {
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o755])
        } catch {
            throw PathError(path: path, problem: "cannot create \(folder): \((error as NSError).localizedDescription)")
        }
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            throw PathError(path: path, problem: "exists and is not a socket; refusing to replace it")
        }
        if isLive(path) {
            throw PathError(path: path, problem: "another process is serving it (is userstored already running?)")
        }
        guard unlink(path) == 0 else {
            throw PathError(path: path, problem: "cannot remove the stale socket: \(String(cString: strerror(errno)))")
        }
    }

    /// Whether something accepts connections on `path` (a bare connect: a stale socket file
    /// refuses it).
    static func isLive(_ path: String) -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return UnixSocketAddress.with(path: path) { connect(descriptor, $0, $1) } == 0
    }

    /// Applies the configured mode and group to a socket the daemon bound.
    static func restrict(_ path: String, mode: UInt32, group: String?) throws {
        guard chmod(path, mode_t(mode)) == 0 else {
            throw PathError(path: path, problem: "chmod failed: \(String(cString: strerror(errno)))")
        }
        if let group {
            guard let gid = AccessRules.resolveGroup(group) else { throw PathError(path: path, problem: "socketGroup '\(group)' does not exist") }
            guard chown(path, uid_t.max, gid) == 0 else {
                throw PathError(path: path, problem: "chown to group \(group) failed: \(String(cString: strerror(errno)))")
            }
        }
    }
}
