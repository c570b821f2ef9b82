import Dispatch
#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// Ctrl-C during a long command: it is recorded, and what the command asked for runs (the
/// daemon client closes its connection, which ends the call in flight); the command then
/// prints what was done and exits 130. The daemon sees the connection close and starts no new
/// store.
public enum Interrupt {
    private static let flag = Atomic<Bool>(false)
    /// The signal source, kept for the life of the process once installed.
    private static let source = Mutex<(any DispatchSourceSignal)?>(nil)

    /// Whether Ctrl-C was pressed.
    public static var requested: Bool { flag.load(ordering: .relaxed) }

    /// Records Ctrl-C from now on (instead of dying of it) and runs `action` on each, off the
    /// main thread (which may be waiting for the daemon).
    public static func watch(_ action: @escaping @Sendable () -> Void = {}) {
        source.withLock { source in
            source?.cancel()
            signal(SIGINT, SIG_IGN) // the source sees it; the default action would kill us first
            let signals = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
            signals.setEventHandler {
                flag.store(true, ordering: .relaxed)
                action()
            }
            signals.resume()
            source = signals
        }
    }
}
