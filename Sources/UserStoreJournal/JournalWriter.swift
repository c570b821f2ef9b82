import CSystemd
import Foundation
import Synchronization

/// Sends entries to journald from a thread of its own, so that logging never blocks a caller:
/// `sd_journal_sendv` blocks once journald's socket queue is full (about ten datagrams when
/// nobody reads). The queue is bounded; past it, entries are dropped and counted, and a
/// `log-entries-dropped` entry says how many once the journal keeps up again.
public final class JournalWriter: Sendable {
    /// The most entries waiting at once.
    public let capacity: Int
    private let state: Mutex<State>
    private let wakeUp = DispatchSemaphore(value: 0)

    private struct State {
        var queue: [[[UInt8]]] = []
        var head = 0
        var dropped = 0
        var droppedSinceReport = 0
        var failures = 0
        var lastError: Int32 = 0
        var sent = 0
    }

    /// Counters, for tests and status.
    public struct Counters: Sendable, Equatable {
        public var sent: Int
        public var dropped: Int
        public var failures: Int
        public var lastError: Int32
        public var waiting: Int
    }

    public init(capacity: Int = 8192) {
        self.capacity = capacity
        self.state = Mutex(State())
        let thread = Thread { [self] in self.drain() }
        thread.name = "userstored-journal"
        thread.start()
    }

    /// Whether an entry would be accepted now (so a caller can skip building one that would be
    /// dropped); counts the drop when not.
    public func reserve() -> Bool {
        state.withLock { state in
            if state.queue.count - state.head < capacity { return true }
            state.dropped += 1
            state.droppedSinceReport += 1
            return false
        }
    }

    /// Queues an entry; returns false when it was dropped because the queue is full.
    @discardableResult
    public func enqueue(_ fields: [[UInt8]]) -> Bool {
        let accepted = state.withLock { state -> Bool in
            guard state.queue.count - state.head < capacity else {
                state.dropped += 1
                state.droppedSinceReport += 1
                return false
            }
            state.queue.append(fields)
            return true
        }
        if accepted { wakeUp.signal() }
        return accepted
    }

    public var counters: Counters {
        state.withLock { Counters(sent: $0.sent, dropped: $0.dropped, failures: $0.failures, lastError: $0.lastError, waiting: $0.queue.count - $0.head) }
    }

    /// Waits (up to `timeout` seconds) until the queue is empty; for an orderly exit.
    public func flush(timeout: Double = 2) {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline, state.withLock({ $0.queue.count - $0.head }) > 0 { usleep(1000) }
    }

    private func drain() {
        while true {
            wakeUp.wait()
            while let (fields, droppedReport) = next() {
                send(fields)
                if droppedReport > 0 {
                    send(JournalFields.entry(level: .warning, message: "\(droppedReport) log entries were dropped: the journal did not keep up",
                                             metadata: ["event": "log-entries-dropped", "dropped": "\(droppedReport)"],
                                             file: #fileID, function: #function, line: #line))
                }
            }
        }
    }

    private func next() -> ([[UInt8]], Int)? {
        state.withLock { state in
            guard state.head < state.queue.count else { return nil }
            let fields = state.queue[state.head]
            state.head += 1
            if state.head > 1024, state.head * 2 > state.queue.count {
                state.queue.removeFirst(state.head)
                state.head = 0
            }
            var report = 0
            if state.head == state.queue.count, state.droppedSinceReport > 0 {
                report = state.droppedSinceReport
                state.droppedSinceReport = 0
            }
            return (fields, report)
        }
    }

    private func send(_ fields: [[UInt8]]) {
        let buffers = fields.map { field -> UnsafeMutableRawBufferPointer in
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(field.count, 1), alignment: 1)
            buffer.copyBytes(from: field)
            return buffer
        }
        defer { for buffer in buffers { buffer.deallocate() } }
        var vectors = zip(buffers.indices, fields).map { index, field in iovec(iov_base: buffers[index].baseAddress, iov_len: field.count) }
        let result = sd_journal_sendv(&vectors, Int32(vectors.count))
        state.withLock { state in
            if result < 0 {
                state.failures += 1
                state.lastError = -result
            } else {
                state.sent += 1
            }
        }
    }
}
