import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An exclusive, cross-process lock on a data directory (`flock` on `<data>/userstore.lock`).
///
/// Whoever holds it is the only process that opens or migrates the directory's stores: the
/// daemon for its lifetime, or `userstorectl --offline` while the daemon is down. The kernel
/// releases it when the holder exits, even by SIGKILL, so a crash never leaves it stuck.
public final class DataDirectoryLock: Sendable {
    /// The lock file.
    public let path: String
    private let descriptor: Int32

    /// Why the lock could not be taken.
    public enum LockError: Error, Equatable, Sendable, CustomStringConvertible {
        /// Another process holds it; `pid` is what that process wrote into the file.
        case held(path: String, pid: Int32?)
        /// The directory or lock file could not be created or opened.
        case unavailable(path: String, message: String)

        public var description: String {
            switch self {
            case .held(let path, let pid):
                return "data directory is in use: \(path) is locked by \(pid.map { "process \($0)" } ?? "another process")"
            case .unavailable(let path, let message):
                return "cannot lock \(path): \(message)"
            }
        }
    }

    /// Creates the data directory if needed and takes the lock without waiting.
    public init(layout: StoreLayout) throws(LockError) {
        path = layout.lockPath
        do {
            try FileManager.default.createDirectory(atPath: layout.dataDirectory, withIntermediateDirectories: true)
        } catch {
            throw .unavailable(path: path, message: (error as NSError).localizedDescription)
        }
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .unavailable(path: path, message: String(cString: strerror(errno))) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let failure = errno
            let holder = Self.readPID(fd)
            close(fd)
            if failure == EWOULDBLOCK { throw .held(path: path, pid: holder) }
            throw .unavailable(path: path, message: String(cString: strerror(failure)))
        }
        let text = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = text.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        descriptor = fd
    }

    /// Whether another process holds the lock of `layout` right now (without taking it).
    public static func isHeld(layout: StoreLayout) -> Bool {
        do {
            _ = try DataDirectoryLock(layout: layout)
            return false
        } catch {
            if case .held = error { return true }
            return false
        }
    }

    deinit {
        close(descriptor)
    }

    private static func readPID(_ fd: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 31, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: buffer[..<count], as: UTF8.self).trimmingWhitespace())
    }
}
