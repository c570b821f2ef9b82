import CSystemd
#if canImport(Glibc)
import Glibc
#endif

/// `sd_notify`: readiness, status text, watchdog pings, stopping. Does nothing (and costs
/// nothing) when the daemon was not started by systemd (`NOTIFY_SOCKET` unset).
public struct SystemdNotifier: Sendable {
    public init() {}

    /// Sends `state` (e.g. `READY=1\nSTATUS=Serving`). Failures are not fatal: the daemon serves
    /// regardless of whether systemd is listening.
    @discardableResult
    public func notify(_ state: String) -> Bool {
        sd_notify(0, state) > 0
    }

    /// The watchdog interval systemd asked for (`WATCHDOG_USEC` for this process), or nil.
    public var watchdogInterval: Duration? {
        var microseconds: UInt64 = 0
        guard sd_watchdog_enabled(0, &microseconds) > 0, microseconds > 0 else { return nil }
        return .microseconds(Int64(microseconds))
    }

    /// The listening socket systemd passed (socket activation), or nil. Only the first of the
    /// passed descriptors is used; it must be a listening Unix stream socket.
    public static func inheritedSocket() -> Int32? {
        let count = sd_listen_fds(1)
        guard count >= 1 else { return nil }
        let descriptor = SD_LISTEN_FDS_START
        guard sd_is_socket_unix(descriptor, Int32(Glibc.SOCK_STREAM.rawValue), 1, nil, 0) > 0 else { return nil }
        return descriptor
    }
}
