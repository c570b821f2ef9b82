import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A Unix socket address (`sockaddr_un`) for `connect` or `bind`.
public enum UnixSocketAddress {
    /// Calls `body` with the address of `path` and its length; nil when `path` does not fit in
    /// `sun_path` (108 bytes with its terminating NUL).
    public static func with<T>(path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws -> T) rethrows -> T? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return try withUnsafePointer(to: &address) {
            try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }
}
