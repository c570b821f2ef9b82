#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// Ctrl-C during a long command: the handler only records the request and shuts the socket
/// down (both async-signal-safe), which ends the blocking read; the command then prints what
/// was done and exits 130. The daemon sees the connection close and starts no new store.
public enum Interrupt {
    private static let flag = Atomic<Bool>(false)
    private static let watched = Atomic<Int32>(-1)

    /// Whether Ctrl-C was pressed.
    public static var requested: Bool { flag.load(ordering: .relaxed) }

    /// Installs the handler for `descriptor`.
    public static func watch(_ descriptor: Int32) {
        watched.store(descriptor, ordering: .relaxed)
        signal(SIGINT) { _ in
            Interrupt.flag.store(true, ordering: .relaxed)
            let fd = Interrupt.watched.load(ordering: .relaxed)
            if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }
}
