import DaemonTestSupport
import Foundation
import Synchronization
import Testing
@testable import UserStoreServer
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// The transport in-process (``InProcessDaemon``): the real event loops, connections and reply
/// queues, looked at from inside — which loop serves which connection, and what a client that
/// does not read its replies does to the daemon's reading.
@Suite(.serialized) struct TransportTests {
    /// `EPOLLEXCLUSIVE` wakes whichever loop waits: a burst of connections used to land on one
    /// loop while the others idled. They are now dealt out in turn.
    @Test func connectionsOpenedTogetherAreSpreadOverTheLoops() async throws {
        let daemon = try await InProcessDaemon.start()
        let loops = (await daemon.server.connectionsPerLoop()).count
        let count = 4 * loops
        nonisolated(unsafe) var clients: [VarlinkConnection] = []
        try await onThread {
            // All connected before the first call: the loops accept them in one burst.
            let opened = try (0..<count).map { _ in try daemon.connect() }
            for client in opened { _ = try client.call("org.varlink.service.GetInfo") }
            clients = opened
        }
        let perLoop = await daemon.server.connectionsPerLoop()
        #expect(perLoop.reduce(0, +) == count)
        #expect(perLoop.allSatisfy { $0 == 4 }, "connections per loop: \(perLoop)")
        clients.removeAll()
        await daemon.stop()
    }

    /// A client that sends calls and does not read the replies: once its unread replies pass the
    /// high watermark the daemon stops reading its calls, so its socket fills and its sends
    /// block — the daemon never holds an unbounded backlog for it. Once it reads, every call is
    /// answered, in order.
    @Test func aClientThatDoesNotReadItsRepliesIsNotReadEither() async throws {
        let daemon = try await InProcessDaemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Open", ["user": "reader"])
        nonisolated(unsafe) let sender = client
        let (sent, remainder) = try await onThread { () -> (Int, [UInt8]) in
            let client = sender
            // Each reply carries ~8 KiB: 20,000 of them would be 160 MiB held for the client.
            let limit = 20_000
            var sent = 0, blocked = false, remainder: [UInt8] = []
            while sent < limit {
                let call = DaemonRobustnessTests.call("io.userstore.Store.Query", [
                    "user": "reader", "sql": "SELECT ? AS n, printf('%8000s', '') AS pad", "parameters": [.integer(Int64(sent))],
                ])
                let written = call.withUnsafeBytes { Glibc.send(client.descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
                if written == call.count { sent += 1; continue }
                if written < 0 {
                    guard errno == EAGAIN || errno == EWOULDBLOCK else { throw POSIXError(.EIO) }
                } else {
                    remainder = Array(call[written...])
                    sent += 1
                }
                blocked = true
                break
            }
            return (blocked ? sent : -1, remainder)
        }
        guard sent > 0 else {
            Issue.record("the daemon read all 20,000 calls of a client that read no reply")
            return await daemon.stop()
        }
        // What the daemon holds for the client once its sends block: at most the high watermark
        // and what one pass over the input adds before it sees it (a flush's worth).
        let held = await daemon.server.heldReplyBytesPerLoop().reduce(0, +)
        #expect(held <= ReplyQueue.highWatermark + ReplyQueue.flushThreshold + 16 * 1024, "reply bytes held for a client that reads nothing: \(held)")
        let inOrder = try await onThread { () -> Bool in
            let client = sender
            // Read everything (on another thread) while the rest of the last call goes out.
            let total = sent
            nonisolated(unsafe) let reader = client
            let inOrder = Mutex(false)
            let finished = DispatchSemaphore(value: 0)
            let done = Thread {
                defer { finished.signal() }
                var ordered = true
                for index in 0..<total {
                    guard let reply = try? reader.readReply() else { ordered = false; break }
                    if reply.parameters["rows"]?.arrayValue?.first?.arrayValue?.first != .integer(Int64(index)) { ordered = false }
                }
                inOrder.withLock { $0 = ordered }
            }
            done.start()
            if !remainder.isEmpty {
                var offset = 0
                while offset < remainder.count {
                    let written = remainder[offset...].withUnsafeBytes { Glibc.send(client.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    guard written > 0 else { throw POSIXError(.EIO) }
                    offset += written
                }
            }
            finished.wait()
            return inOrder.withLock { $0 }
        }
        #expect(inOrder, "not every reply came back in order")
        await daemon.stop()
    }

    /// A message's read time (`limits.requestReadSeconds`) counts only while the daemon waits
    /// for the client: part of a message that sits in the input while the daemon itself does not
    /// read — a task call runs alone, here a first Open whose migration takes seconds — is not a
    /// stalled client. (A full test run starved such a task for over 30 s and the daemon cut the
    /// connection with `LimitExceeded`.)
    @Test func partOfAMessageWaitingBehindATaskIsNotAStall() async throws {
        let slow = "CREATE TABLE t AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 6000000) SELECT x FROM c;"
        let daemon = try await InProcessDaemon.start(migrations: ["0001_slow.sql": slow], extraConfig: "limits:\n  requestReadSeconds: 1\n")
        let client = try daemon.connect()
        nonisolated(unsafe) let sender = client
        let replies = try await onThread { () -> [String?] in
            let query = DaemonRobustnessTests.call("io.userstore.Store.Query", ["user": "slow", "sql": "SELECT count(*) FROM t"])
            // The Open, and half of the next call, in one write: the half waits in the input
            // while the Open's migration runs (well over requestReadSeconds).
            try sender.send(raw: DaemonRobustnessTests.call("io.userstore.Store.Open", ["user": "slow"]) + query[..<(query.count / 2)])
            let opened = try sender.readReply()
            try sender.send(raw: Array(query[(query.count / 2)...]))
            let counted = try sender.readReply()
            return [opened.error ?? "ok", counted.error ?? "ok"]
        }
        #expect(replies == ["ok", "ok"])
        await daemon.stop()
    }
}
