import CUnixSocket
import Varlink
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// The listening socket on one ``EventLoop``: every loop waits on it (`EPOLLEXCLUSIVE`: the
/// kernel wakes one loop per incoming connection), and the loop that wakes accepts; the
/// ``LoopSpread`` decides which loop serves each connection.
/// Confined to its loop's thread (asserted in debug builds; reached from elsewhere only through
/// `loop.execute`), hence `@unchecked Sendable`.
final class Acceptor: EventHandler, @unchecked Sendable {
    private let listener: Int32
    private let loop: EventLoop
    private let spread: LoopSpread
    private let shared: Session.Shared
    private var token: UInt64?
    private var finished = false

    init(listener: Int32, loop: EventLoop, spread: LoopSpread, shared: Session.Shared) {
        self.listener = listener
        self.loop = loop
        self.spread = spread
        self.shared = shared
    }

    /// Starts accepting (on the loop's thread).
    func start() {
        assert(loop.inEventLoop)
        guard token == nil, !finished else { return }
        do {
            token = try loop.register(listener, events: EPOLLIN.rawValue | EPOLLEXCLUSIVE.rawValue, self)
        } catch {
            shared.logger.error("cannot wait for connections: \(error)", metadata: ["event": "accept-failed"])
        }
    }

    /// Stops accepting for good (on the loop's thread).
    func finish() {
        assert(loop.inEventLoop)
        finished = true
        stop()
    }

    private func stop() {
        guard let token else { return }
        loop.unregister(listener, token: token)
        self.token = nil
    }

    func ready(_ events: UInt32) {
        assert(loop.inEventLoop)
        for _ in 0..<16 {
            let descriptor = us_accept(listener)
            if descriptor >= 0 {
                spread.serve(descriptor, shared: shared)
                continue
            }
            switch errno {
            case EINTR, ECONNABORTED:
                continue
            case EAGAIN, EWOULDBLOCK:
                return
            case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                // Out of descriptors or memory: the connection stays in the backlog; stop looking
                // for a moment instead of spinning on a listener that stays readable.
                shared.logger.warning("cannot accept a connection: \(String(cString: strerror(errno))); retrying in 100 ms",
                                      metadata: ["event": "accept-failed"])
                stop()
                loop.schedule(after: 100_000_000) { [self] in start() }
                return
            default:
                shared.logger.error("accept failed: \(String(cString: strerror(errno)))", metadata: ["event": "accept-failed"])
                return
            }
        }
    }
}
