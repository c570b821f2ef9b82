#if canImport(Glibc)
import Glibc
#endif

/// What a connection has received and not handled yet, cut into NUL-terminated messages: the
/// input side of both ends of a varlink connection (the daemon's `Connection`, the client's
/// `ClientConnection`).
///
/// Reads go straight into its free space (``withFreeSpace(_:)``); it never holds more than one
/// maximal message and a read, and gives back the memory a long message made it take.
public struct InputBuffer {
    private var bytes: [UInt8] = []
    /// Unhandled bytes: `bytes[start..<end]`.
    private var start = 0, end = 0
    /// Stream offset of `bytes[0]`: the number of bytes consumed before it.
    private var origin = 0
    private var framer: MessageFramer

    /// A buffer for messages of up to `maxMessageBytes` (the NUL excluded).
    public init(maxMessageBytes: Int) {
        framer = MessageFramer(maxMessageBytes: maxMessageBytes)
    }

    /// Longest message accepted.
    public var maxMessageBytes: Int { framer.maxMessageBytes }

    /// Whether every byte received was handled.
    public var isEmpty: Bool { start == end }

    /// Whether what is left holds a whole message (its NUL arrived).
    public var holdsWholeMessage: Bool { bytes[start..<end].contains(0) }

    /// Stream offset just past the last byte received.
    public var receivedOffset: Int { origin + end }

    /// Calls `body` with the free space at the end (at least 4 KiB: made first) to read into;
    /// `body` returns how many bytes it put there (0 or less: none).
    public mutating func withFreeSpace(_ body: (UnsafeMutableRawBufferPointer) -> Int) -> Int {
        makeRoom()
        let end = self.end
        let received = bytes.withUnsafeMutableBytes { buffer in body(UnsafeMutableRawBufferPointer(rebasing: buffer[end...])) }
        if received > 0 { self.end += received }
        return received
    }

    /// Whether a whole message is at the front (``MessageFramer/Next/message(length:)``: its
    /// bytes stay in the buffer until ``consume(_:)``), and how long.
    public mutating func next() -> MessageFramer.Next {
        let (start, end) = (self.start, self.end)
        return bytes.withUnsafeBytes { buffer in framer.next(in: UnsafeRawBufferPointer(rebasing: buffer[start..<end])) }
    }

    /// Calls `body` with the first `length` bytes (a message ``next()`` found).
    public func withMessage<T>(length: Int, _ body: (UnsafeBufferPointer<UInt8>) throws -> T) rethrows -> T {
        try bytes.withUnsafeBufferPointer { buffer in try body(UnsafeBufferPointer(rebasing: buffer[start..<(start + length)])) }
    }

    /// Stream offset of the end (the NUL) of a message of `length` at the front.
    public func offset(afterMessageOf length: Int) -> Int { origin + start + length }

    /// Drops a message of `length` and its NUL from the front.
    public mutating func consume(_ length: Int) {
        start += length + 1
    }

    /// A message at the front stays for later (it is handled again once it may be): forget how
    /// far it was searched.
    public mutating func keep() {
        framer.reset()
    }

    /// Drops everything received and not handled (a message over the limit, a stalled one).
    public mutating func discard() {
        start = end
        framer.reset()
    }

    /// Gives back the memory (the connection closed).
    public mutating func release() {
        bytes = []
        origin += end
        start = 0
        end = 0
    }

    /// Ensures at least 4 KiB free after `end`: moves unhandled bytes to the front, or grows
    /// (never beyond one maximal message and a read).
    private mutating func makeRoom() {
        if start == end {
            origin += start
            start = 0
            end = 0
            if bytes.count > 1 << 20 { bytes = [] } // a large message made it big
        }
        if bytes.isEmpty { bytes = [UInt8](repeating: 0, count: 16_384) }
        if bytes.count - end >= 4096 { return }
        if start > 0 {
            let (from, count) = (start, end - start)
            bytes.withUnsafeMutableBytes { buffer in _ = memmove(buffer.baseAddress!, buffer.baseAddress! + from, count) }
            origin += start
            end -= start
            start = 0
            if bytes.count - end >= 4096 { return }
        }
        let limit = framer.maxMessageBytes + 65_536
        bytes.append(contentsOf: repeatElement(0, count: min(max(bytes.count, 16_384), max(limit - bytes.count, 4096))))
    }
}
