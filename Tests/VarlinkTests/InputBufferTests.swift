import Testing
@testable import Varlink

/// ``InputBuffer``: messages received in pieces of any size come out whole and in order, with
/// their stream offsets; a message over the limit is named and dropped; one kept is found again.
struct InputBufferTests {
    /// Feeds `bytes` into `buffer` in pieces of `sizes` (cycled); returns the messages taken out.
    static func feed(_ bytes: [UInt8], into buffer: inout InputBuffer, sizes: [Int]) -> (messages: [[UInt8]], ends: [Int]) {
        var messages: [[UInt8]] = [], ends: [Int] = []
        var sent = 0, turn = 0
        let base = buffer.receivedOffset
        while sent < bytes.count {
            let size = min(sizes[turn % sizes.count], bytes.count - sent)
            turn += 1
            let received = buffer.withFreeSpace { free in
                let count = min(size, free.count)
                for index in 0..<count { free[index] = bytes[sent + index] }
                return count
            }
            sent += received
            #expect(buffer.receivedOffset == base + sent)
            while case .message(let length) = buffer.next() {
                messages.append(buffer.withMessage(length: length) { Array($0) })
                ends.append(buffer.offset(afterMessageOf: length))
                buffer.consume(length)
            }
        }
        return (messages, ends)
    }

    @Test(arguments: [[1], [3, 7, 1], [4096], [100_000], [5000, 1, 70_000]])
    func messagesInPiecesComeOutWholeInOrderWithTheirOffsets(sizes: [Int]) {
        var buffer = InputBuffer(maxMessageBytes: 1 << 20)
        let sent: [[UInt8]] = (0..<50).map { index in Array("{\"message\": \(index), \"pad\": \"\(String(repeating: "x", count: index * 997 % 30_000))\"}".utf8) }
        let stream: [UInt8] = sent.flatMap { $0 + [UInt8(0)] }
        let (messages, ends) = Self.feed(stream, into: &buffer, sizes: sizes)
        #expect(messages == sent)
        var offset = 0
        let expected = sent.map { message -> Int in offset += message.count + 1; return offset - 1 }
        #expect(ends == expected)
        #expect(buffer.isEmpty && !buffer.holdsWholeMessage)
    }

    @Test func aMessageOverTheLimitIsNamedAndDroppedAndTheNextComesThrough() {
        var buffer = InputBuffer(maxMessageBytes: 1000)
        let large = [UInt8](repeating: UInt8(ascii: "a"), count: 1500)
        _ = buffer.withFreeSpace { free in
            for index in 0..<large.count { free[index] = large[index] }
            return large.count
        }
        #expect(buffer.next() == .tooLarge)
        buffer.discard()
        #expect(buffer.isEmpty)
        let (messages, _) = Self.feed(Array("{}".utf8) + [0], into: &buffer, sizes: [1])
        #expect(messages == [Array("{}".utf8)])
    }

    @Test func aMessageKeptIsFoundAgain() {
        var buffer = InputBuffer(maxMessageBytes: 1000)
        let bytes = Array("{\"a\": 1}".utf8) + [0]
        _ = buffer.withFreeSpace { free in
            for index in 0..<bytes.count { free[index] = bytes[index] }
            return bytes.count
        }
        guard case .message(let length) = buffer.next() else {
            Issue.record("no message")
            return
        }
        buffer.keep()
        #expect(buffer.holdsWholeMessage)
        #expect(buffer.next() == .message(length: length))
        buffer.consume(length)
        #expect(buffer.isEmpty)
    }
}
