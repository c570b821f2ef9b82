import Dispatch
import Foundation
import Synchronization
import Testing
@testable import UserStoreServer
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// ``ReplyQueue`` on a real event loop and a `socketpair`: replies leave in request order
/// whatever finishes first; a full queue and an unread socket stop reading; bytes the socket did
/// not take leave later, whole and in order; a reply that arrives after the connection closed is
/// dropped; a failed socket is reported.
@Suite(.serialized)
final class ReplyQueueTests {
    let loop: EventLoop
    /// `ours` is the daemon's end (non-blocking, as a connection's), `theirs` the client's.
    let ours: Int32, theirs: Int32
    let replies: ReplyQueue
    /// Signalled by ``ReplyQueue/onDelivery`` (on the loop): a reserved reply arrived.
    let delivered = DispatchSemaphore(value: 0)

    init() throws {
        loop = try EventLoop(name: "reply-queue-test")
        loop.start()
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw TransportError.system("socketpair", errno)
        }
        (ours, theirs) = (pair[0], pair[1])
        _ = fcntl(ours, F_SETFL, fcntl(ours, F_GETFL) | O_NONBLOCK)
        replies = ReplyQueue(loop: loop)
        let delivered = self.delivered
        onLoop { [replies] in replies.onDelivery = { delivered.signal() } }
    }

    deinit {
        loop.stopAndWait()
        close(ours)
        close(theirs)
    }

    /// Runs `body` on the loop's thread and returns what it returns.
    @discardableResult
    func onLoop<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let done = DispatchSemaphore(value: 0)
        let result = Mutex<T?>(nil)
        loop.execute {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }

    /// Appends `text` and a NUL as a ready reply.
    func append(_ text: String) {
        onLoop { [replies] in replies.append { $0.bytes.append(contentsOf: Array(text.utf8) + [0]) } }
    }

    /// Completes `reply` from another thread, as a store's queue does, and waits until the
    /// queue says it arrived (a failure, not a hang, when it never says so).
    func complete(_ reply: QueuedReply, _ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        DispatchQueue.global().async { reply.complete(Array(text.utf8) + [0]) }
        let arrived = delivered.wait(timeout: .now() + 10) == .success
        #expect(arrived, "the reply's arrival was never told (onDelivery)", sourceLocation: sourceLocation)
    }

    /// Flushes the ready replies on the loop; false when the socket failed.
    @discardableResult
    func flush() -> Bool {
        onLoop { [replies, ours] in replies.flush(to: ours) }
    }

    // The queue's state, read on the loop.
    var inOrder: Bool { onLoop { [replies] in replies.isInOrder } }
    var isFull: Bool { onLoop { [replies] in replies.isFull } }
    var isWritable: Bool { onLoop { [replies] in replies.isWritable } }
    var hasUnsent: Bool { onLoop { [replies] in replies.hasUnsent } }
    var heldBytes: Int { onLoop { [replies] in replies.heldBytes } }
    func writeUnsent() -> Bool { onLoop { [replies, ours] in replies.writeUnsent(to: ours) } }

    /// Everything the client's end can read now, without waiting (what a flush sent is there).
    func received() -> String {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = recv(theirs, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count <= 0 { break }
            bytes += buffer[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self).replacingOccurrences(of: "\0", with: "|")
    }

    @Test func repliesLeaveInRequestOrderWhateverFinishesFirst() {
        append("A")
        let b = onLoop { [replies] in replies.reserve() }
        append("C")
        let d = onLoop { [replies] in replies.reserve() }
        append("E")
        #expect(inOrder == false)
        flush()
        #expect(received() == "A|")

        // D finishes first: it and E wait behind B.
        complete(d, "D")
        flush()
        #expect(received() == "")
        #expect(heldBytes == 6) // C, D, E and their NULs

        complete(b, "B")
        #expect(inOrder)
        flush()
        #expect(received() == "B|C|D|E|")
        #expect(heldBytes == 0)
    }

    @Test func anErrorAppendedBehindAReservedReplyWaitsForIt() throws {
        let first = onLoop { [replies] in replies.reserve() }
        onLoop { [replies] in replies.append(VarlinkError("io.userstore.Store.InvalidParameter", ["parameter": .string("sql")])) }
        flush()
        #expect(received() == "")
        complete(first, "{}")
        flush()
        let text = received()
        #expect(text.hasPrefix("{}|{"))
        #expect(text.contains("\"error\":\"io.userstore.Store.InvalidParameter\""))
    }

    @Test func aQueueOfReservedRepliesStopsReadingAtItsLimitAndResumesWhenOneArrives() {
        let reserved = onLoop { [replies] in (0..<ReplyQueue.maxPendingReplies).map { _ in replies.reserve() } }
        #expect(isFull)
        complete(reserved[0], "first")
        #expect(isFull == false)
        flush()
        #expect(received() == "first|")
    }

    @Test func bytesTheSocketDoesNotTakeWaitForItAndLeaveWholeInOrder() {
        var small: Int32 = 4096
        setsockopt(ours, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        // 1 MiB of replies, each a distinct line, far past what the socket holds.
        let lines = (0..<16_384).map { String(format: "reply %06d %@", $0, String(repeating: "x", count: 50)) }
        for line in lines { append(line) }
        #expect(flush())
        #expect(hasUnsent)
        #expect(isWritable == false) // past the high watermark

        var text = ""
        var rounds = 0
        while hasUnsent {
            text += received()
            #expect(writeUnsent())
            rounds += 1
        }
        text += received()
        #expect(rounds > 1)
        #expect(isWritable)
        #expect(text == lines.map { $0 + "|" }.joined())
    }

    @Test func aReplyThatArrivesAfterTheConnectionClosedIsDropped() {
        let late = onLoop { [replies] in replies.reserve() }
        append("behind")
        onLoop { [replies] in replies.close() }
        late.complete(Array("late".utf8) + [0])
        onLoop {} // the completion hopped to the loop before this: it has run
        #expect(heldBytes == 0)
        #expect(flush())
        #expect(received() == "")
    }

    @Test func aSocketWhosePeerClosedIsReportedAsFailed() {
        shutdown(theirs, Int32(SHUT_RDWR))
        append("nobody reads this")
        #expect(flush() == false)
    }
}
