import CUnixSocket
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Something registered with an ``EventLoop``: told, on the loop's thread, which epoll events
/// fired for its descriptor.
package protocol EventHandler: AnyObject {
    func ready(_ events: UInt32)
}

/// Something that asked its ``EventLoop`` to be told when the loop's turn ends
/// (``EventLoop/atEndOfTurn(_:)``): after every handler, timer and task of the turn, before the
/// loop waits again.
package protocol TurnEndHandler: AnyObject {
    func turnEnded()
}

/// One thread waiting on epoll: each turn runs the timers that are due, the handlers of the
/// descriptors that became ready and tasks handed to it from other threads (``execute(_:)``,
/// woken through an eventfd); then, before it waits again, tells the handlers that asked
/// (``atEndOfTurn(_:)``).
///
/// The daemon's own, rather than SwiftNIO's, because a varlink peer may pass file descriptors
/// with a call (`SCM_RIGHTS`, as systemd's varlink services do) and NIO reads stream sockets
/// with `read(2)`, which makes the kernel drop them; this loop's connections use `recvmsg(2)`.
/// UserStoreClient reads its replies on one too (docs/design.md says why).
///
/// Thread-safety: ``execute(_:)``, ``executeSoon(_:)``, ``modify(_:token:events:)`` and
/// ``inEventLoop`` from anywhere; everything else only on the loop's thread (its state is
/// confined there, hence `@unchecked Sendable`).
package final class EventLoop: @unchecked Sendable {
    package let name: String
    private let epoll: Int32
    private let wakeDescriptor: Int32
    private struct Inbox {
        var tasks: [@Sendable () -> Void] = []
        var woken = false
    }
    private let inbox = Mutex(Inbox())
    private let thread = Atomic<UInt>(0)
    private let finished = DispatchSemaphore(value: 0)

    // Loop-confined.
    private var handlers: [UInt64: any EventHandler] = [:]
    private var nextToken: UInt64 = 1
    private var timers: [Timer] = []
    private var nextTimer = 0
    private var stopping = false
    private var soon: [@Sendable () -> Void] = []
    private var endOfTurn: [any TurnEndHandler] = []

    private struct Timer {
        var deadline: UInt64
        var id: Int
        var task: () -> Void
    }

    package init(name: String) throws {
        self.name = name
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeDescriptor = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        guard epoll >= 0, wakeDescriptor >= 0 else { throw TransportError.system("epoll_create1/eventfd", errno) }
        guard us_epoll_ctl(epoll, EPOLL_CTL_ADD, wakeDescriptor, EPOLLIN.rawValue, 0) == 0 else {
            throw TransportError.system("epoll_ctl", errno)
        }
    }

    deinit {
        close(epoll)
        close(wakeDescriptor)
    }

    /// Starts the loop's thread.
    package func start() {
        let thread = Thread { [self] in
            // The kernel's name (ps -L, top -H, perf): Foundation's `name` does not set it here.
            us_set_thread_name(name)
            self.thread.store(UInt(pthread_self()), ordering: .releasing)
            run()
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    /// Whether the caller runs on this loop's thread.
    package var inEventLoop: Bool { thread.load(ordering: .acquiring) == UInt(pthread_self()) }

    /// Runs `task` on the loop's thread, after what is already queued (from any thread).
    package func execute(_ task: @escaping @Sendable () -> Void) {
        let wake = inbox.withLock { inbox in
            inbox.tasks.append(task)
            defer { inbox.woken = true }
            return !inbox.woken
        }
        if wake {
            var one: UInt64 = 1
            _ = write(wakeDescriptor, &one, 8)
        }
    }

    /// Runs `task` on the loop's thread: called there, after the handlers of this turn (no
    /// eventfd write, no extra `epoll_wait`), so it may overtake tasks other threads queued
    /// meanwhile; called elsewhere, as ``execute(_:)``. For work whose order against other
    /// threads' tasks does not matter (the jobs of a `TaskExecutor`).
    package func executeSoon(_ task: @escaping @Sendable () -> Void) {
        guard inEventLoop else { return execute(task) }
        soon.append(task)
    }

    /// Calls `handler.turnEnded()` once this turn's handlers, timers and tasks have run, before
    /// the loop waits again (on the loop's thread). The connections send their replies there:
    /// written together at the end of a turn, a client thread woken by the first finds the
    /// others already there instead of being woken again for each (the daemon's wake-ups of
    /// its clients were most of its CPU at 64 connections: docs/performance.md). A handler may
    /// ask again while told (it is told again in the same pass), but must not every time, or
    /// the loop never waits again.
    package func atEndOfTurn(_ handler: any TurnEndHandler) {
        assert(inEventLoop, "\(name): used off its thread")
        endOfTurn.append(handler)
    }

    /// Asks the loop to end once the handlers registered have gone, and waits for it.
    package func stopAndWait() {
        execute { [self] in stopping = true }
        finished.wait()
    }

    // MARK: Registration (on the loop's thread)

    /// Registers `handler` for `events` on `descriptor`; returns the token to change or remove it.
    package func register(_ descriptor: Int32, events: UInt32, _ handler: any EventHandler) throws -> UInt64 {
        assert(inEventLoop, "\(name): used off its thread")
        let token = nextToken
        nextToken += 1
        guard us_epoll_ctl(epoll, EPOLL_CTL_ADD, descriptor, events, token) == 0 else { throw TransportError.system("epoll_ctl", errno) }
        handlers[token] = handler
        return token
    }

    /// Changes the events `descriptor` (registered as `token`) waits for. Safe from any thread
    /// (it is one `epoll_ctl`), as long as the descriptor stays registered meanwhile.
    package func modify(_ descriptor: Int32, token: UInt64, events: UInt32) {
        _ = us_epoll_ctl(epoll, EPOLL_CTL_MOD, descriptor, events, token)
    }

    /// Removes `descriptor` (registered as `token`); call before closing it.
    package func unregister(_ descriptor: Int32, token: UInt64) {
        assert(inEventLoop, "\(name): used off its thread")
        _ = us_epoll_ctl(epoll, EPOLL_CTL_DEL, descriptor, 0, 0)
        handlers[token] = nil
    }

    /// Runs `task` on the loop after `nanoseconds`; returns an id for ``cancel(_:)``.
    @discardableResult
    package func schedule(after nanoseconds: UInt64, _ task: @escaping () -> Void) -> Int {
        assert(inEventLoop, "\(name): used off its thread")
        nextTimer += 1
        timers.append(Timer(deadline: StoreClock.now() + nanoseconds, id: nextTimer, task: task))
        return nextTimer
    }

    package func cancel(_ timer: Int) {
        assert(inEventLoop, "\(name): used off its thread")
        timers.removeAll { $0.id == timer }
    }

    /// Runs `body` with every handler registered (on the loop's thread).
    package func forEachHandler(_ body: (any EventHandler) -> Void) {
        assert(inEventLoop, "\(name): used off its thread")
        for handler in handlers.values { body(handler) }
    }

    // MARK: The loop

    private func run() {
        var tokens = [UInt64](repeating: 0, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        while !(stopping && handlers.isEmpty) {
            let count = tokens.withUnsafeMutableBufferPointer { tokens in
                events.withUnsafeMutableBufferPointer { events in
                    us_epoll_wait(epoll, tokens.baseAddress, events.baseAddress, 64, timeoutMilliseconds())
                }
            }
            if count < 0 {
                if errno == EINTR { continue }
                fatalError("\(name): epoll_wait failed: \(String(cString: strerror(errno)))")
            }
            // Timers first: the last turn has ended, so a timer (the connections' idle sweep)
            // never sees what a turn left for its end — a reply delivered in this turn and not
            // yet written would look like an idle connection's.
            runTimers()
            for index in 0..<Int(count) {
                if tokens[index] == 0 {
                    runTasks()
                } else if let handler = handlers[tokens[index]] {
                    handler.ready(events[index])
                }
            }
            // One batch per turn: tasks that queue more (a task that yields, two that resume
            // each other) must not keep the loop from its descriptors; the next wait then
            // does not block.
            if !soon.isEmpty {
                let tasks = soon
                soon.removeAll(keepingCapacity: true)
                for task in tasks { task() }
            }
            // A handler told here may ask again (its turn's work made more): it is told in
            // this same pass.
            var told = 0
            while told < endOfTurn.count {
                endOfTurn[told].turnEnded()
                told += 1
            }
            endOfTurn.removeAll(keepingCapacity: true)
        }
        // Timers (the periodic sweep reschedules itself) capture the loop: drop them so the
        // loop can be freed (AddressSanitizer's leak check found the cycle).
        timers.removeAll()
        inbox.withLock { $0.tasks.removeAll() }
    }

    private func runTasks() {
        var drained: UInt64 = 0
        _ = read(wakeDescriptor, &drained, 8)
        let tasks = inbox.withLock { inbox in
            inbox.woken = false
            defer { inbox.tasks.removeAll(keepingCapacity: true) }
            return inbox.tasks
        }
        for task in tasks { task() }
    }

    private func timeoutMilliseconds() -> Int32 {
        if !soon.isEmpty { return 0 }
        guard let next = timers.min(by: { $0.deadline < $1.deadline })?.deadline else { return -1 }
        let now = StoreClock.now()
        return next <= now ? 0 : Int32(min((next - now + 999_999) / 1_000_000, 60_000))
    }

    private func runTimers() {
        guard !timers.isEmpty else { return }
        let now = StoreClock.now()
        let due = timers.filter { $0.deadline <= now }
        guard !due.isEmpty else { return }
        timers.removeAll { $0.deadline <= now }
        for timer in due { timer.task() }
    }
}

/// Monotonic nanoseconds (a vDSO call).
package enum StoreClock {
    package static func now() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}

/// A system call of the transport failed.
package enum TransportError: Error, CustomStringConvertible {
    case system(String, Int32)
    case closed

    package var description: String {
        switch self {
        case .system(let call, let code): return "\(call): \(String(cString: strerror(code)))"
        case .closed: return "the connection is closed"
        }
    }
}
