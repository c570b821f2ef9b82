#if canImport(Glibc)
import Glibc
#endif

/// Cuts NUL-terminated varlink messages from a byte stream that arrives in pieces, never
/// holding more than `maxMessageBytes` of an unfinished one.
///
/// Remembers how far it already searched, so a long message arriving in many reads is scanned
/// once (a 16 MiB message in 64 KiB reads would otherwise cost gigabytes of searching).
public struct MessageFramer: Sendable {
    /// Longest message accepted (the NUL excluded).
    public let maxMessageBytes: Int
    /// Bytes at the start of the unconsumed input already searched for a NUL.
    private var scanned = 0

    public init(maxMessageBytes: Int) {
        self.maxMessageBytes = maxMessageBytes
    }

    public enum Next: Equatable, Sendable {
        /// A complete message: its bytes are `input[..<length]`, followed by its NUL.
        case message(length: Int)
        /// No complete message yet.
        case needMore
        /// The message being received is longer than `maxMessageBytes`.
        case tooLarge
    }

    /// The next message at the start of `input` (the bytes not consumed yet). After a
    /// `.message`, the caller consumes `length + 1` bytes before calling again.
    public mutating func next(in input: UnsafeRawBufferPointer) -> Next {
        let start = min(scanned, input.count)
        let found: Int? = input.count > start ? memchr(input.baseAddress! + start, 0, input.count - start)
            .map { input.baseAddress!.distance(to: UnsafeRawPointer($0)) } : nil
        guard let length = found else {
            scanned = input.count
            return input.count > maxMessageBytes ? .tooLarge : .needMore
        }
        scanned = 0
        return length > maxMessageBytes ? .tooLarge : .message(length: length)
    }

    /// Forgets the search position (the input was discarded).
    public mutating func reset() {
        scanned = 0
    }
}
