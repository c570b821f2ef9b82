import DaemonTestSupport
import CUnixSocket
import Foundation
import Synchronization
import Testing
@testable import UserStoreClient
import Varlink

/// UserStoreClient against a live daemon: the calls applications make, exact values, pooling
/// and pipelining, transactions (commit, rollback, cancellation), streamed queries, and a
/// daemon killed and restarted under load.
@Suite(.serialized) struct ClientTests {
    static let migrations = ["0001_notes.sql": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL, n INTEGER);\n"]

    /// A daemon with these migrations, started. Its transaction limits (idle, and total) are five
    /// and ten minutes: the other suites run in parallel and can starve the cooperative pool (2
    /// threads here) for tens of seconds on a loaded machine, which must not expire a transaction
    /// between two of its calls. No test here relies on those limits.
    static func startedDaemon(_ migrations: [String: String] = Self.migrations) throws -> DaemonHarness {
        let daemon = try DaemonHarness(migrations: migrations,
                                       extraConfig: "limits:\n  transactionIdleMilliseconds: 300000\n  transactionMilliseconds: 600000\n")
        try daemon.start()
        return daemon
    }

    struct Note: Decodable, Equatable {
        let id: Int64
        let body: String
        let n: Int64?
    }

    @Test(.timeLimit(.minutes(2)))
    func theDocumentedCallsWorkAsWritten() async throws {
        let daemon = try Self.startedDaemon()
        let (inserted, total, notes) = try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            let alice = client.store(for: "alice")
            let result = try await alice.execute("INSERT INTO notes(body, n) VALUES (?, ?)", "hello", 42)
            #expect(result.changes == 1)
            #expect(result.lastInsertRowID == 1)
            let rows = try await alice.query("SELECT id, body FROM notes WHERE id > ?", 0)
            #expect(try rows[0].decode(String.self, column: "body") == "hello")
            #expect(try rows[0].decode(Int64.self, column: 0) == 1)
            let notes = try await alice.query(Note.self, "SELECT * FROM notes")
            let total = try await alice.transaction { tx in
                try await tx.execute("INSERT INTO notes(body, n) VALUES (?, ?)", "second", nil)
                let n = try await tx.query("SELECT count(*) AS n FROM notes")
                return try n[0].decode(Int64.self, column: "n")
            }
            return (result, total, notes)
        }
        #expect(inserted.changes == 1)
        #expect(total == 2)
        #expect(notes == [Note(id: 1, body: "hello", n: 42)])
    }

    @Test(.timeLimit(.minutes(2)))
    func errorsAreNamedAndCarryTheDaemonsParameters() async throws {
        let daemon = try Self.startedDaemon()
        try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            let bob = client.store(for: "bob")
            try await bob.execute("INSERT INTO notes(id, body) VALUES (1, 'a')")
            let unique = await #expect(throws: UserStoreError.self) { try await bob.execute("INSERT INTO notes(id, body) VALUES (1, 'b')") }
            #expect(unique?.name == "SQLError")
            #expect(unique?.kind == .daemon)
            #expect(unique?.code == 1555) // SQLITE_CONSTRAINT_PRIMARYKEY
            #expect(unique?.qualifiedName == "io.userstore.Store.SQLError")
            let invalid = await #expect(throws: UserStoreError.self) { try await client.store(for: "../etc").open() }
            #expect(invalid?.name == "InvalidUser")
            let batch = await #expect(throws: UserStoreError.self) {
                try await bob.batch(Statement("INSERT INTO notes(body) VALUES (?)", "fine"), Statement("INSERT INTO nope VALUES (1)"))
            }
            #expect(batch?.statementIndex == 1)
            // The batch ran in one transaction: its first statement left nothing.
            #expect(try await bob.query("SELECT count(*) FROM notes")[0].decode(Int64.self, column: 0) == 1)
        }
        let missing = await #expect(throws: UserStoreError.self) {
            try await UserStoreClient.withClient(socketPath: daemon.directory.path + "/no-such.sock") { try await $0.store(for: "x").open() }
        }
        #expect(missing?.kind == .connectionFailed)
        #expect(missing?.name == "ConnectionFailed")
    }

    struct Everything: Decodable, Equatable {
        let id: Int64
        let smallest: Int64
        let largest: Int64
        let real: Double
        let tiny: Double
        let huge: Double
        let negative: Double
        let text: String
        let blob: Data
        let bytes: [UInt8]
        let empty: Data
        let missing: String?
        let flag: Bool
    }

    @Test(.timeLimit(.minutes(2)))
    func aDecodableStructRoundTripsEverySQLiteTypeExactly() async throws {
        let daemon = try Self.startedDaemon([
            "0001_everything.sql": """
                CREATE TABLE everything (id INTEGER PRIMARY KEY, smallest INTEGER, largest INTEGER, real REAL, tiny REAL,
                    huge REAL, negative REAL, text TEXT, blob BLOB, bytes BLOB, empty BLOB, missing TEXT, flag INTEGER);

                """,
        ])
        let expected = Everything(id: 7, smallest: .min, largest: .max, real: 2.0, tiny: .leastNonzeroMagnitude, huge: 1.7976931348623157e308,
                                  negative: -0.1, text: "nul \u{0} emoji 👩‍👩‍👧 and \"quotes\"\n", blob: Data([0, 1, 2, 0, 255]),
                                  bytes: [0xde, 0xad, 0, 0xef], empty: Data(), missing: nil, flag: true)
        let (decoded, types) = try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            let carol = client.store(for: "carol")
            try await carol.execute("INSERT INTO everything VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", expected.id, expected.smallest,
                                    expected.largest, expected.real, expected.tiny, expected.huge, expected.negative, expected.text,
                                    expected.blob, expected.bytes, expected.empty, expected.missing, expected.flag)
            let decoded = try await carol.query(Everything.self, "SELECT * FROM everything")
            let types = try await carol.query("SELECT typeof(largest), typeof(real), typeof(blob), typeof(empty), typeof(missing) FROM everything")
            return (decoded, types[0].values)
        }
        #expect(decoded == [expected])
        #expect(types == [.text("integer"), .text("real"), .text("blob"), .text("blob"), .text("null")])
    }

    @Test(.timeLimit(.minutes(2)))
    func decodingRefusesWhatWouldLoseInformation() async throws {
        let daemon = try Self.startedDaemon()
        let row = try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            try await client.store(for: "dave").query("SELECT 2.5 AS real, 'x' AS text, NULL AS empty, 3000000000 AS big")[0]
        }
        #expect(throws: DecodingError.self) { try row.decode(Int64.self, column: "real") }
        #expect(throws: DecodingError.self) { try row.decode(Int64.self, column: "text") }
        #expect(throws: DecodingError.self) { try row.decode(String.self, column: "empty") }
        #expect(throws: DecodingError.self) { try row.decode(Int32.self, column: "big") }
        #expect(throws: DecodingError.self) { try row.decode(Int64.self, column: "absent") }
        #expect(try row.decode(String?.self, column: "empty") == nil)
        #expect(try row.decode(Double.self, column: "big") == 3_000_000_000)
    }

    @Test(.timeLimit(.minutes(5)))
    func aThousandConcurrentTasksOverAPoolOfEightAllGetTheirOwnResults() async throws {
        let daemon = try Self.startedDaemon()
        let users = 40, tasks = 1000
        let (results, connections) = try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: { $0.connections = 8 }) { client in
            let results = try await withThrowingTaskGroup(of: (Int, Int64, String).self) { group in
                for task in 0..<tasks {
                    // Half of them on the client's own executor (the thread that reads replies).
                    group.addTask(executorPreference: task % 2 == 0 ? client.executor : nil) {
                        let store = client.store(for: "user\(task % users)")
                        let id = try await store.execute("INSERT INTO notes(body, n) VALUES (?, ?)", "task \(task)", task).lastInsertRowID
                        let rows = try await store.query("SELECT body FROM notes WHERE id = ?", id)
                        return (task, id, try rows[0].decode(String.self, column: "body"))
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            return (results, client.openConnections)
        }
        #expect(results.count == tasks)
        for (task, _, body) in results { #expect(body == "task \(task)") }
        #expect(connections <= 8 && connections >= 1)
        // Every insert is in its user's store, once.
        try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            for user in 0..<users {
                let ns = try await client.store(for: "user\(user)").query("SELECT n FROM notes ORDER BY n").map { try $0.decode(Int.self, column: 0) }
                #expect(ns == Array(stride(from: user, to: tasks, by: users)))
            }
        }
    }

    /// Calls and replies far larger than a socket buffer (the call is written in parts as the
    /// daemon reads, the reply read into a grown buffer) arrive whole, in order, and the small
    /// calls pipelined behind them on the same connection get their own replies. Also from tasks
    /// on the client's executor: the thread that reads the replies writes what the socket did
    /// not take.
    @Test(.timeLimit(.minutes(2)), arguments: [false, true])
    func callsAndRepliesLargerThanTheSocketBuffersArriveWhole(onClientExecutor: Bool) async throws {
        let daemon = try Self.startedDaemon()
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: { $0.connections = 1 }) { client in
            let carol = client.store(for: "carol")
            let bodies = (0..<4).map { index in String(repeating: "\(index)abcdefghijklmnopqrstuvwxyz", count: 150_000 + index) }
            try await withThrowingTaskGroup(of: Void.self) { group in
                let executor = onClientExecutor ? client.executor : nil
                for (index, body) in bodies.enumerated() {
                    group.addTask(executorPreference: executor) { try await carol.execute("INSERT INTO notes(id, body) VALUES (?, ?)", index + 1, body) }
                    group.addTask(executorPreference: executor) {
                        let rows = try await carol.query("SELECT ? AS echo", "small \(index)")
                        #expect(try rows[0].decode(String.self, column: "echo") == "small \(index)")
                    }
                }
                try await group.waitForAll()
            }
            let rows = try await carol.query("SELECT id, body FROM notes ORDER BY id")
            #expect(rows.count == 4)
            for (index, row) in rows.enumerated() {
                #expect(try row.decode(String.self, column: "body") == bodies[index])
            }
            #expect(client.openConnections == 1)
        }
    }

    @Test(.timeLimit(.minutes(2)))
    func aTransactionCommitsOnReturnAndRollsBackOnThrow() async throws {
        let daemon = try Self.startedDaemon()
        struct Refused: Error {}
        try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            let erin = client.store(for: "erin")
            await #expect(throws: Refused.self) {
                try await erin.transaction { tx in
                    try await tx.execute("INSERT INTO notes(body) VALUES ('rolled back')")
                    throw Refused()
                }
            }
            try await erin.transaction(mode: .deferred) { tx in
                try await tx.execute("INSERT INTO notes(body) VALUES ('kept')")
                // A failing batch inside leaves the transaction as it was, and open.
                await #expect(throws: UserStoreError.self) {
                    try await tx.batch([Statement("INSERT INTO notes(body) VALUES ('half')"), Statement("INSERT INTO nope VALUES (1)")])
                }
            }
            let bodies = try await erin.query("SELECT body FROM notes").map { try $0.decode(String.self, column: 0) }
            #expect(bodies == ["kept"])
        }
    }

    @Test(.timeLimit(.minutes(2)))
    func aCancelledTaskInsideATransactionLeavesNothingBehind() async throws {
        let daemon = try Self.startedDaemon()
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: { $0.connections = 1 }) { client in
            let frank = client.store(for: "frank")
            let (wrote, signal) = AsyncStream.makeStream(of: Void.self)
            let task = Task {
                try await frank.transaction { tx in
                    try await tx.execute("INSERT INTO notes(body) VALUES ('never committed')")
                    signal.yield()
                    // Keep calling until cancelled: the cancellation lands during one of these calls
                    // or between them.
                    while true { try await tx.execute("INSERT INTO notes(body) VALUES ('more')") }
                }
            }
            for await _ in wrote { break }
            task.cancel()
            let outcome = await task.result
            #expect(throws: CancellationError.self) { try outcome.get() }
            // The one connection is free again and the store has nothing of the transaction.
            let left = try await frank.query("SELECT count(*) FROM notes")[0].decode(Int64.self, column: 0)
            #expect(left == 0)
            let again: Int64 = try await frank.transaction { tx in try await tx.query("SELECT 1")[0].decode(Int64.self, column: 0) }
            #expect(again == 1)
        }
    }

    @Test(.timeLimit(.minutes(1)))
    func aStreamedQueryDeliversEveryRowInOrderAndCanStopEarly() async throws {
        let daemon = try Self.startedDaemon()
        let count = 20_000
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: { $0.streamBufferRows = 64; $0.connections = 2 }) { client in
            let gina = client.store(for: "gina")
            try await gina.execute("""
                INSERT INTO notes(id, body, n) SELECT value, 'row ' || value, value * value
                FROM (WITH RECURSIVE c(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM c WHERE value < \(count)) SELECT value FROM c)
                """)
            var seen = 0
            for try await row in try await gina.stream("SELECT id, body, n FROM notes WHERE id > ? ORDER BY id", 0) {
                seen += 1
                #expect(try row.decode(Int64.self, column: "id") == Int64(seen))
                #expect(try row.decode(Int64.self, column: "n") == Int64(seen * seen))
            }
            #expect(seen == count)
            // Stopping after a few rows ends the stream: the store is free for the next call.
            var few = 0
            for try await _ in try await gina.stream("SELECT id FROM notes") {
                few += 1
                if few == 10 { break }
            }
            #expect(few == 10)
            #expect(try await gina.query("SELECT count(*) FROM notes")[0].decode(Int.self, column: 0) == count)
            // Only reads stream; the error arrives as the sequence's.
            let writing = await #expect(throws: UserStoreError.self) {
                for try await _ in try await gina.stream("DELETE FROM notes RETURNING id") {}
            }
            #expect(writing?.name == "SQLError")
            #expect(writing?.code == 8)
            #expect(try await gina.query("SELECT count(*) FROM notes")[0].decode(Int.self, column: 0) == count)
        }
    }

    /// A stream whose consumer is slow has stopped reading (its buffer is full) when the daemon
    /// dies: the rows already received still arrive in order, then a ConnectionClosed, never a
    /// hang; and the client works again once the daemon is back.
    @Test(.timeLimit(.minutes(1)))
    func aPausedStreamWhoseDaemonDiesDeliversItsRowsThenAnError() async throws {
        let daemon = try Self.startedDaemon()
        let count = 20_000 // 2 MB of rows: more than the socket buffers hold
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: {
            $0.streamBufferRows = 16
            $0.connections = 1
        }) { client in
            let lena = client.store(for: "lena")
            try await lena.execute("""
                INSERT INTO notes(id, body) SELECT value, printf('%100d', value)
                FROM (WITH RECURSIVE c(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM c WHERE value < \(count)) SELECT value FROM c)
                """)
            var rows = try await lena.stream("SELECT id, body FROM notes ORDER BY id").makeAsyncIterator()
            #expect(try await rows.next()?.decode(Int64.self, column: "id") == 1)
            daemon.stop(signal: SIGKILL)
            var last: Int64 = 1
            do {
                while let row = try await rows.next() {
                    let id = try row.decode(Int64.self, column: "id")
                    #expect(id == last + 1)
                    last = id
                }
                Issue.record("the stream ended without an error after \(last) rows")
            } catch let error as UserStoreError {
                #expect(error.kind == .connectionClosed, "\(error)")
            }
            #expect(last < Int64(count))
            // No connect failed meanwhile (no back-off): the next call connects to the new daemon.
            try daemon.start()
            #expect(try await lena.query("SELECT count(*) FROM notes")[0].decode(Int.self, column: 0) == count)
        }
    }

    /// The reply threads: one per two cores, or USERSTORE_CLIENT_THREADS (scripts/test.sh runs
    /// this suite again with 3), and the process really runs that many.
    @Test(.timeLimit(.minutes(1)))
    func theReplyThreadsFollowTheCoresOrTheEnvironment() async throws {
        #expect(ClientLoop.threads(environment: [:], cores: 1) == 1)
        #expect(ClientLoop.threads(environment: [:], cores: 2) == 1)
        #expect(ClientLoop.threads(environment: [:], cores: 8) == 4)
        #expect(ClientLoop.threads(environment: [:], cores: 64) == 4)
        #expect(ClientLoop.threads(environment: ["USERSTORE_CLIENT_THREADS": "3"], cores: 2) == 3)
        #expect(ClientLoop.threads(environment: ["USERSTORE_CLIENT_THREADS": "0"], cores: 2) == 1)
        #expect(ClientLoop.threads(environment: ["USERSTORE_CLIENT_THREADS": "many"], cores: 8) == 4)
        let daemon = try Self.startedDaemon()
        try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            _ = try await client.store(for: "mona").open()
        }
        let tasks = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")
        let names = tasks.compactMap { try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8) }
        let expected = ClientLoop.threads(environment: ProcessInfo.processInfo.environment, cores: Int(us_cpu_count()))
        #expect(names.filter { $0.hasPrefix("userstore-clien") }.count == expected) // comm keeps 15 bytes
    }

    /// Descriptors passed with calls that queue behind a long one (the socket takes only part of
    /// it) still go with their own calls, from the connection's copies: the callers' own are
    /// closed before anything is read. The peer here reads as the daemon does, a descriptor
    /// belonging to the message that holds the last byte of the read it came with.
    @Test(.timeLimit(.minutes(1)))
    func queuedDescriptorsGoWithTheirOwnCalls() async throws {
        let directory = NSTemporaryDirectory() + "client-fds-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/peer.sock"
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        try #require(UnixSocketAddress.with(path: path) { bind(listener, $0, $1) } == 0)
        try #require(listen(listener, 1) == 0)
        let connection = try await ClientConnection.connect(to: path, loop: try ClientLoop.next(), maxMessageBytes: 1 << 26) { _ in }
        let peer = accept(listener, nil, nil)
        try #require(peer >= 0)
        defer { close(peer) }

        let files = try ["first", "second"].map { name -> Int32 in
            try Data(name.utf8).write(to: URL(fileURLWithPath: directory + "/" + name))
            return open(directory + "/" + name, O_RDONLY | O_CLOEXEC)
        }
        var big = CallMessage(method: "test.Big")
        big.field("pad", String(repeating: "x", count: 2 << 20))
        let messages: [([UInt8], [Int32])] = [
            (big.finish(), []),
            (CallMessage(method: "test.First").finish(), [files[0]]),
            (CallMessage(method: "test.Plain").finish(), []),
            (CallMessage(method: "test.Second").finish(), [files[1]]),
        ]
        for (message, descriptors) in messages { try connection.send(message, descriptors: descriptors, to: .single(PendingReply())) }
        for file in files { close(file) }

        var stream: [UInt8] = [], passed: [(end: Int, descriptor: Int32)] = [], ends = 0
        var chunk = [UInt8](repeating: 0, count: 4096)
        var received = [Int32](repeating: -1, count: 16)
        while ends < messages.count {
            var ready = pollfd(fd: peer, events: Int16(POLLIN), revents: 0)
            try #require(poll(&ready, 1, 10_000) == 1, "the client stopped sending")
            var count: Int32 = 0
            let read = us_recv_with_fds(peer, &chunk, chunk.count, &received, 16, &count)
            try #require(read > 0)
            stream += chunk[..<read]
            ends += chunk[..<read].count(where: { $0 == 0 })
            for index in 0..<Int(count) { passed.append((stream.count - 1, received[index])) }
        }
        // Which message each descriptor came with, and which file it is.
        let messageEnds = stream.indices.filter { stream[$0] == 0 }
        var owners: [Int: String] = [:]
        for (end, descriptor) in passed {
            var content = [UInt8](repeating: 0, count: 16)
            let length = pread(descriptor, &content, 16, 0)
            close(descriptor)
            owners[try #require(messageEnds.firstIndex { $0 >= end })] = String(decoding: content[..<max(0, length)], as: UTF8.self)
        }
        #expect(owners == [1: "first", 3: "second"])
        connection.close()
    }

    /// A call that finds every connection taken and the pool backing off after a failed connect
    /// waits for the back-off to end, then connects: it is not left asleep until a connection
    /// is given back (here that would be never: the transaction holding it waits for the call).
    @Test(.timeLimit(.minutes(1)))
    func aCallWaitingOutTheBackOffConnectsWhenItEnds() async throws {
        let daemon = try Self.startedDaemon()
        let hidden = daemon.socketPath + ".away"
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: {
            $0.connections = 2
            $0.minimumReconnectDelay = .seconds(1) // long enough that the next call surely finds it going on
        }) { client in
            let nina = client.store(for: "nina"), otto = client.store(for: "otto")
            try await nina.transaction { tx in
                try await tx.execute("INSERT INTO notes(body) VALUES ('held')")
                // The other slot cannot connect: the socket's name is gone (the daemon still
                // listens, so the transaction's connection lives on).
                try #require(rename(daemon.socketPath, hidden) == 0)
                let refused = await #expect(throws: UserStoreError.self) { try await otto.open() }
                #expect(refused?.kind == .connectionFailed)
                #expect(refused?.systemError == ENOENT)
                try #require(rename(hidden, daemon.socketPath) == 0)
                // In back-off, with the only live connection taken: this call waits, and must be
                // woken when the back-off ends.
                #expect(try await otto.open().user == "otto")
            }
        }
        #expect(daemon.stop() == 0)
    }

    /// The untyped calls tools use (userstorectl is built on them): any method, streamed
    /// replies, and a file passed as a descriptor with its call while other calls are queued on
    /// the same connection (it must reach the import, not a call before it).
    @Test(.timeLimit(.minutes(2)))
    func anyMethodCanBeCalledStreamedAndPassedAFile() async throws {
        let daemon = try Self.startedDaemon()
        let exported = NSTemporaryDirectory() + "client-export-\(getpid()).db"
        defer { unlink(exported) }
        try await UserStoreClient.withClient(socketPath: daemon.socketPath, configuration: { $0.connections = 1 }) { client in
            let hana = client.store(for: "hana")
            for n in 1...50 { try await hana.execute("INSERT INTO notes(body, n) VALUES (?, ?)", "note \(n)", n) }
            let status = try await client.call("io.userstore.Admin.Status")
            #expect(status["openStores"]?.integerValue == 1)
            let unknown = await #expect(throws: UserStoreError.self) { try await client.call("io.userstore.Admin.NoSuchMethod") }
            #expect(unknown?.name == "MethodNotFound")

            var file = Data(), replies = 0
            for try await reply in try await client.stream("io.userstore.Admin.ExportStore", ["user": "hana", "format": "sqlite"]) {
                replies += 1
                if let chunk = reply["chunk"]?.stringValue { file.append(try #require(Data(base64Encoded: chunk))) }
            }
            #expect(replies >= 1)
            #expect(file.starts(with: Data("SQLite format 3\0".utf8)))
            try file.write(to: URL(fileURLWithPath: exported))

            let descriptor = open(exported, O_RDONLY | O_CLOEXEC)
            try #require(descriptor >= 0)
            defer { close(descriptor) }
            // Pipelined on the one connection: reads before and after the import, and calls of
            // 4 MB whose bytes the socket cannot take at once, so that calls queue behind them
            // (then the descriptor waits for its own call's first byte).
            let big = String(repeating: "x", count: 4 << 20)
            let counts = try await withThrowingTaskGroup(of: Int64?.self) { group in
                for index in 0..<20 {
                    if index % 4 == 1 {
                        group.addTask {
                            try await client.store(for: "kay").execute("INSERT INTO notes(body) VALUES (?)", big)
                            return nil
                        }
                    }
                    if index == 10 {
                        group.addTask {
                            _ = try await client.call("io.userstore.Admin.ImportStore", ["user": "iris"], passing: [descriptor])
                            return nil
                        }
                    }
                    group.addTask { try await hana.query("SELECT count(*) FROM notes")[0].decode(Int64.self, column: 0) }
                }
                return try await group.reduce(into: [Int64]()) { if let count = $1 { $0.append(count) } }
            }
            #expect(counts == Array(repeating: 50, count: 20))
            let iris = try await client.store(for: "iris").query(Note.self, "SELECT * FROM notes ORDER BY id")
            #expect(iris.count == 50)
            #expect(iris.last == Note(id: 50, body: "note 50", n: 50))
            // Without the descriptor, the daemon says what is missing.
            let missing = await #expect(throws: UserStoreError.self) {
                try await client.call("io.userstore.Admin.ImportStore", ["user": "jack"])
            }
            #expect(missing?.kind == .daemon)
        }
    }

    @Test(.timeLimit(.minutes(5)))
    func killingAndRestartingTheDaemonGivesCleanErrorsThenRecoveryWithNoAcknowledgedWriteLost() async throws {
        let daemon = try Self.startedDaemon()
        final class Log: Sendable {
            let acknowledged = Mutex<[String: [Int64]]>([:])
            let failures = Mutex<[UserStoreError]>([])
            let foreign = Mutex<[String]>([])
            let stop = Atomic<Bool>(false)
        }
        let log = Log()
        let client = UserStoreClient(configuration: {
            var configuration = UserStoreClient.Configuration(socketPath: daemon.socketPath)
            configuration.minimumReconnectDelay = .milliseconds(10)
            configuration.maximumReconnectDelay = .milliseconds(100)
            return configuration
        }())
        let writers = Task {
            await withTaskGroup(of: Void.self) { group in
                for writer in 0..<8 {
                    group.addTask {
                        let user = "writer\(writer % 4)"
                        var next: Int64 = Int64(writer) << 32
                        while !log.stop.load(ordering: .relaxed) {
                            next += 1
                            do {
                                try await client.store(for: user).execute("INSERT INTO notes(body, n) VALUES ('w', ?)", next)
                                log.acknowledged.withLock { $0[user, default: []].append(next) }
                            } catch let error as UserStoreError {
                                log.failures.withLock { $0.append(error) }
                                await Task.yield()
                            } catch {
                                log.foreign.withLock { $0.append("\(error)") }
                            }
                        }
                    }
                }
            }
        }
        func total() -> Int { log.acknowledged.withLock { $0.values.reduce(0) { $0 + $1.count } } }
        func waitUntil(_ condition: () -> Bool) async throws {
            let deadline = ContinuousClock.now + .seconds(60)
            while !condition() {
                guard ContinuousClock.now < deadline else { throw CancellationError() }
                try await Task.sleep(for: .milliseconds(2))
            }
        }
        try await waitUntil { total() >= 300 }
        daemon.stop(signal: SIGKILL)
        try await waitUntil { log.failures.withLock { $0.count } >= 8 }
        let beforeRestart = total()
        try daemon.start()
        try await waitUntil { total() >= beforeRestart + 300 }
        log.stop.store(true, ordering: .relaxed)
        await writers.value
        // Every error was a named transport error (the daemon vanished), never anything else.
        #expect(log.foreign.withLock { $0 }.isEmpty)
        for error in log.failures.withLock({ $0 }) {
            #expect(error.kind == .connectionClosed || error.kind == .connectionFailed, "\(error)")
        }
        // Every write the client was told succeeded is in the store.
        for (user, values) in log.acknowledged.withLock({ $0 }) {
            let stored = Set(try await client.store(for: user).query("SELECT n FROM notes").map { try $0.decode(Int64.self, column: 0) })
            let lost = values.filter { !stored.contains($0) }
            #expect(lost.isEmpty, "\(user) lost \(lost.count) acknowledged writes")
        }
        await client.shutdown()
    }

    @Test(.timeLimit(.minutes(3)))
    func aWatchDeliversEachChangeOnceAndResumesByItselfAcrossARestart() async throws {
        let daemon = try Self.startedDaemon()
        try await UserStoreClient.withClient(socketPath: daemon.socketPath) { client in
            let carol = client.store(for: "carol")
            _ = try await carol.open()
            var events = carol.watch(tables: ["notes"], values: true).makeAsyncIterator()
            let ready = try #require(try await events.next())
            #expect(ready.kind == .ready)
            try await carol.execute("INSERT INTO notes(body, n) VALUES ('one', 1)")
            let first = try #require(try await events.next())
            #expect(first.kind == .changes && first.position == ready.position + 1)
            let change = try #require(first.changes.first)
            #expect(change.table == "notes" && change.operation == .insert && change.rowid == 1)
            #expect(change.values?["body"] == .text("one") && change.values?["n"] == .integer(1))

            // The daemon restarts under the watch: the sequence connects again and resumes after
            // `first` by itself — a new ready, then the next change, nothing twice.
            #expect(daemon.stop() == 0)
            try daemon.start()
            var updated = false
            for _ in 0..<100 where !updated {
                do {
                    try await carol.execute("UPDATE notes SET n = 2") // idempotent: safe to send again
                    updated = true
                } catch let error as UserStoreError where error.kind == .connectionClosed || error.kind == .connectionFailed {
                    try await Task.sleep(for: .milliseconds(50)) // the pool's reconnect back-off
                }
            }
            #expect(updated)
            let again = try #require(try await events.next())
            #expect(again.kind == .ready && again.position >= first.position)
            let second = try #require(try await events.next())
            #expect(second.kind == .changes && second.position == first.position + 1)
            #expect(second.changes.first?.operation == .update && second.changes.first?.values?["n"] == .integer(2))
        }
    }

}
