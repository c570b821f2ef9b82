import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// The request path under pipelining: calls sent together without waiting, answered in order;
/// per-store order across the event loop's fast path and the stores' queues; isolation of a slow
/// statement; a client that goes away mid-stream.
@Suite(.serialized) struct PipeliningTests {
    func encode(_ method: String, _ parameters: [String: JSONValue]) -> [UInt8] {
        DaemonRobustnessTests.call(method, parameters)
    }

    /// Reads `count` replies from `client`.
    func replies(_ count: Int, from client: VarlinkConnection) throws -> [VarlinkReplyMessage] {
        try (0..<count).map { _ in try client.readReply() }
    }

    @Test(arguments: Serving.allCases) func manyCallsInOneWriteAreAllAnsweredInOrder(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            _ = try client.call("io.userstore.Store.Open", ["user": "alice"])
            // Fast reads, writes (the store's queue), first opens (a task), errors, a Batch and an
            // Admin call, all in one write: every reply must come back, in request order.
            var bytes: [UInt8] = []
            var checks: [(VarlinkReplyMessage) -> Bool] = []
            var inserted = 0
            for index in 0..<600 {
                let i = JSONValue.integer(Int64(index))
                switch index % 7 {
                case 0:
                    bytes += encode("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT ?", "parameters": [i]])
                    checks.append { $0.parameters["rows"] == [[i]] }
                case 1:
                    bytes += encode("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title) VALUES (?)", "parameters": [.string("n\(index)")]])
                    inserted += 1
                    checks.append { $0.error == nil && $0.parameters["changes"] == 1 }
                case 2:
                    let expected = JSONValue.integer(Int64(inserted))
                    bytes += encode("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"])
                    checks.append { $0.parameters["rows"] == [[expected]] }
                case 3:
                    bytes += encode("io.userstore.Store.Open", ["user": .string("new\(index)")])
                    checks.append { $0.parameters["created"] == true && $0.parameters["user"] == .string("new\(index)") }
                case 4:
                    bytes += encode("io.userstore.Store.Query", ["user": "alice", "sql": "SELEC broken"])
                    checks.append { $0.error == "io.userstore.Store.SQLError" }
                case 5:
                    bytes += encode("io.userstore.Store.Batch", ["user": "alice", "statements": [
                        ["sql": "INSERT INTO notes (title) VALUES ('batch')"], ["sql": "SELECT ?", "parameters": [i]],
                    ]])
                    inserted += 1
                    checks.append { $0.parameters["results"]?.arrayValue?.last?["rows"] == [[i]] }
                default:
                    bytes += encode("io.userstore.Admin.Status", [:])
                    checks.append { $0.parameters["daemonVersion"] != nil }
                }
            }
            try client.send(raw: bytes)
            for (index, reply) in try replies(checks.count, from: client).enumerated() {
                #expect(checks[index](reply), "call \(index): \(reply)")
            }
            #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"])["rows"] == [[.integer(Int64(inserted))]])
        }
    }

    @Test(arguments: Serving.allCases) func readsAndQueuedWritesOfOneStoreKeepTheirOrder(serving: Serving) async throws {
        try await serving.run { daemon in
            let setup = try daemon.connect()
            _ = try setup.call("io.userstore.Store.Execute", ["user": "bob", "sql": "CREATE TABLE counter (n INTEGER NOT NULL)"])
            _ = try setup.call("io.userstore.Store.Execute", ["user": "bob", "sql": "INSERT INTO counter VALUES (0)"])
            // One connection pipelines write, read, write, read...: each read sees exactly the
            // writes sent before it, though reads may run on the event loop and writes on the queue.
            let writer = try daemon.connect()
            var bytes: [UInt8] = []
            for _ in 0..<300 {
                bytes += encode("io.userstore.Store.Execute", ["user": "bob", "sql": "UPDATE counter SET n = n + 1"])
                bytes += encode("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT n FROM counter"])
            }
            // Meanwhile another connection reads the same store: the counter never goes back.
            let seen = Mutex<[Int64]>([])
            let readerDone = DispatchSemaphore(value: 0)
            nonisolated(unsafe) let served = daemon // connect() only: thread-safe in every kind
            let reader = Thread {
                defer { readerDone.signal() }
                guard let client = try? served.connect() else { return }
                for _ in 0..<300 {
                    guard let rows = try? client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT n FROM counter"]),
                          let n = rows["rows"]?.arrayValue?.first?.arrayValue?.first?.integerValue else { return }
                    seen.withLock { $0.append(n) }
                }
            }
            reader.start()
            try writer.send(raw: bytes)
            let answers = try replies(600, from: writer)
            for round in 0..<300 {
                #expect(answers[2 * round].parameters["changes"] == 1)
                #expect(answers[2 * round + 1].parameters["rows"] == [[.integer(Int64(round + 1))]], "round \(round)")
            }
            readerDone.wait()
            let observed = seen.withLock { $0 }
            #expect(observed.count == 300)
            #expect(observed == observed.sorted(), "a read saw the counter go back")
        }
    }

    /// An Open pipelined behind writes to the same store is answered in its turn (on the
    /// store's queue when the store is busy, inline when it is idle), with the store's row.
    @Test(arguments: Serving.allCases) func opensBetweenQueuedWritesAnswerInTheirTurn(serving: Serving) async throws {
        try await serving.run { daemon in
            let setup = try daemon.connect()
            let first = try setup.call("io.userstore.Store.Open", ["user": "carol"])
            _ = try setup.call("io.userstore.Store.Execute", ["user": "carol", "sql": "CREATE TABLE counter (n INTEGER NOT NULL)"])
            _ = try setup.call("io.userstore.Store.Execute", ["user": "carol", "sql": "INSERT INTO counter VALUES (0)"])
            let client = try daemon.connect()
            var bytes: [UInt8] = []
            for _ in 0..<200 {
                bytes += encode("io.userstore.Store.Execute", ["user": "carol", "sql": "UPDATE counter SET n = n + 1"])
                bytes += encode("io.userstore.Store.Open", ["user": "carol"])
                bytes += encode("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT n FROM counter"])
            }
            try client.send(raw: bytes)
            let answers = try replies(600, from: client)
            for round in 0..<200 {
                #expect(answers[3 * round].parameters["changes"] == 1)
                let open = answers[3 * round + 1]
                #expect(open.error == nil && open.parameters["user"] == "carol", "round \(round)")
                #expect(open.parameters["schemaVersion"] == first["schemaVersion"] && open.parameters["created"] == false)
                #expect(open.parameters["appliedVersions"] == [])
                #expect(answers[3 * round + 2].parameters["rows"] == [[.integer(Int64(round + 1))]], "round \(round)")
            }
        }
    }

    @Test(arguments: Serving.allCases) func aSlowStatementOfOneUserNeverHoldsUpAnother(serving: Serving) async throws {
        try await serving.run(extraConfig: "limits:\n  statementTimeoutMilliseconds: 60000\n") { daemon in
            let slowClient = try daemon.connect()
            _ = try slowClient.call("io.userstore.Store.Open", ["user": "slow"])
            nonisolated(unsafe) let served = daemon // connect() only: thread-safe in every kind
            // A read-only statement that runs for seconds starts on the event loop (its store is
            // idle), is given up after its inline budget and finishes on the store's queue. The
            // event loops serve everyone else meanwhile: with four connections, one at least
            // shares the slow connection's event loop, and each of them gets answers before the
            // slow statement's.
            let endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 8000000) SELECT count(*) FROM n"
            let slowSent = Atomic<Bool>(false), slowDone = Atomic<Bool>(false)
            let answeredWhileSlow = Mutex([Int](repeating: 0, count: 4))
            let ready = DispatchGroup(), finished = DispatchGroup()
            let threads = (0..<4).map { offset in
                ready.enter()
                finished.enter()
                return Thread {
                    defer { finished.leave() }
                    let client = try? served.connect()
                    _ = try? client?.call("io.userstore.Store.Open", ["user": "quick"])
                    ready.leave()
                    guard let client else { return }
                    while !slowDone.load(ordering: .acquiring) {
                        guard (try? client.call("io.userstore.Store.Query", ["user": "quick", "sql": "SELECT 1"])) != nil else { return }
                        if slowSent.load(ordering: .acquiring) && !slowDone.load(ordering: .acquiring) { answeredWhileSlow.withLock { $0[offset] += 1 } }
                    }
                }
            }
            for thread in threads { thread.start() }
            ready.wait()
            try slowClient.send(VarlinkCall(method: "io.userstore.Store.Query", parameters: ["user": "slow", "sql": .string(endless)]))
            slowSent.store(true, ordering: .releasing)
            let slow = try slowClient.readReply()
            slowDone.store(true, ordering: .releasing)
            #expect(slow.parameters["rows"] == [[8_000_000]])
            finished.wait()
            let counts = answeredWhileSlow.withLock { $0 }
            #expect(counts.allSatisfy { $0 >= 10 }, "answers per connection while the slow statement ran: \(counts)")
        }
    }

    /// A client that sends a burst of calls with large replies and hangs up at once, reading
    /// nothing: the daemon's flush inside the burst fails (EPIPE) and closes the connection
    /// while it is still cutting calls from the input. That used to go on slicing an emptied
    /// buffer (a crash found by the live fuzz); now only that connection ends.
    @Test(.timeLimit(.minutes(10)))
    func aHangUpInTheMiddleOfABurstEndsOnlyThatConnection() async throws {
        try await onThread { [self] in
            let daemon = try DaemonHarness()
            try daemon.start()
            let setup = try daemon.connect()
            setup.setReceiveTimeout(seconds: 30)
            _ = try setup.call("io.userstore.Store.Open", ["user": "burst"])
            // 400 fast-path reads (~40 KiB, within the socket's buffer, so the send completes) whose
            // ~4 KiB replies pass the 64 KiB flush threshold after 16 calls.
            let call = encode("io.userstore.Store.Query", ["user": "burst", "sql": "SELECT hex(zeroblob(2048))"])
            let burst = Array([[UInt8]](repeating: call, count: 400).joined())
            for _ in 0..<50 {
                do {
                    let client = try daemon.connect()
                    try client.send(raw: burst)
                } // closed here, replies unread
                #expect(try setup.call("io.userstore.Store.Query", ["user": "burst", "sql": "SELECT 42"])["rows"] == [[42]])
            }
            #expect(daemon.stop() == 0)
        }
    }

    @Test(arguments: Serving.allCases) func aClientThatPipelinesAndHangsUpLeavesNothingHalfDone(serving: Serving) async throws {
        try await serving.run { daemon in
            let setup = try daemon.connect()
            _ = try setup.call("io.userstore.Store.Execute", ["user": "carol", "sql": "CREATE TABLE pairs (a INTEGER NOT NULL, b INTEGER NOT NULL)"])
            // 2,000 two-row transactions and single inserts sent at once, then the connection is
            // closed without reading a reply. What ran, ran whole and in order: a prefix of the
            // calls, each Batch entirely or not at all.
            let client = try daemon.connect()
            var bytes: [UInt8] = []
            for index in 0..<2000 {
                let i = JSONValue.integer(Int64(index))
                if index % 2 == 0 {
                    bytes += encode("io.userstore.Store.Batch", ["user": "carol", "statements": [
                        ["sql": "INSERT INTO pairs VALUES (?, 1)", "parameters": [i]], ["sql": "INSERT INTO pairs VALUES (?, 2)", "parameters": [i]],
                    ]])
                } else {
                    bytes += encode("io.userstore.Store.Execute", ["user": "carol", "sql": "INSERT INTO pairs VALUES (?, 0)", "parameters": [i]])
                }
            }
            try client.send(raw: bytes)
            _ = try client.readReply() // at least one ran
            shutdown(client.descriptor, Int32(SHUT_RDWR))
            // Once the daemon has closed that connection, it starts nothing more of it; what it
            // started is queued on the store ahead of the query below. Then the store holds a prefix.
            var open: JSONValue? = 2
            for _ in 0..<10_000 where open != 1 {
                open = try setup.call("io.userstore.Admin.Status")["connections"]
            }
            #expect(open == 1)
            let rows = try setup.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT a, b FROM pairs ORDER BY rowid"])["rows"]?.arrayValue ?? []
            var expected: [JSONValue] = []
            var index = 0
            while expected.count < rows.count {
                let i = JSONValue.integer(Int64(index))
                expected += index % 2 == 0 ? [[i, 1], [i, 2]] : [[i, 0]]
                index += 1
            }
            #expect(!rows.isEmpty)
            #expect(rows == expected, "not a prefix of whole calls: \(rows.count) rows")
            #expect(try setup.call("io.userstore.Admin.Verify", ["users": ["carol"]])["failures"] == 0)
        }
    }

    @Test(arguments: Serving.allCases) func aClientThatClosesItsSendingSideStillGetsItsReplies(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            var bytes: [UInt8] = []
            for index in 0..<50 {
                bytes += encode("io.userstore.Store.Query", ["user": "dave", "sql": "SELECT ?", "parameters": [.integer(Int64(index))]])
            }
            try client.send(raw: bytes)
            shutdown(client.descriptor, Int32(SHUT_WR))
            for (index, reply) in try replies(50, from: client).enumerated() {
                #expect(reply.parameters["rows"] == [[.integer(Int64(index))]])
            }
            #expect(throws: VarlinkConnection.TransportError.self) { try client.readReply() } // then the daemon closes
        }
    }
}
