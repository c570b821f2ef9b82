import Foundation
import Varlink
import Synchronization

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`: collects every message the
/// daemon sends (READY=1, STATUS=..., WATCHDOG=1, STOPPING=1) and lets a test wait for one.
public final class NotifySocket: Sendable {
    public let path: String
    private let descriptor: Int32
    private let messages = Mutex<[String]>([])
    private let arrived = DispatchSemaphore(value: 0)

    public init(path: String) throws {
        self.path = path
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let result = UnixSocketAddress.with(path: path) { bind(fd, $0, $1) }
        guard fd >= 0, result == 0 else { throw CocoaError(.fileWriteUnknown) }
        descriptor = fd
        let thread = Thread { [self] in self.receive() }
        thread.start()
    }

    deinit {
        shutdown(descriptor, Int32(SHUT_RDWR))
        close(descriptor)
    }

    private func receive() {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return }
            let text = String(decoding: buffer[..<count], as: UTF8.self)
            messages.withLock { $0.append(text) }
            arrived.signal()
        }
    }

    /// Every message so far.
    public var all: [String] { messages.withLock { $0 } }

    /// Every `KEY=value` line so far.
    public var lines: [String] { all.flatMap { $0.split(separator: "\n").map(String.init) } }

    /// Waits until some line satisfies `predicate`; false after `timeout`.
    public func waitFor(timeout: Double = 30, _ predicate: (String) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if lines.contains(where: predicate) { return true }
            let remaining = deadline.timeIntervalSinceNow
            if remaining <= 0 { return false }
            _ = arrived.wait(timeout: .now() + remaining)
        }
    }
}
