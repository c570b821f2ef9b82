import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// `io.userstore.Store.Watch` against a live daemon: every committed transaction exactly once
/// and in order, nothing rolled back, resuming by position across disconnects and restarts,
/// PositionLost past what is kept.
@Suite(.serialized) struct WatchTests {
    static let watchOn = "watch:\n  enabled: true\n"

    func watch(_ connection: VarlinkConnection, user: String, since: Int64? = nil, values: Bool = false, tables: [String]? = nil) throws -> Int64 {
        var parameters: [String: JSONValue] = ["user": .string(user), "values": .bool(values)]
        if let since { parameters["since"] = .integer(since) }
        if let tables { parameters["tables"] = .array(tables.map { .string($0) }) }
        try connection.send(VarlinkCall(method: "io.userstore.Store.Watch", parameters: parameters, more: true))
        let ready = try connection.readReply().checked()
        #expect(ready.continues)
        #expect(ready.parameters["ready"]?.boolValue == true)
        return try #require(ready.parameters["position"]?.integerValue)
    }

    func next(_ connection: VarlinkConnection) throws -> [String: JSONValue] {
        let reply = try connection.readReply().checked()
        #expect(reply.continues)
        return reply.parameters
    }

    func execute(_ connection: VarlinkConnection, _ user: String, _ sql: String, _ parameters: [JSONValue] = []) throws {
        _ = try connection.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string(sql), "parameters": .array(parameters)])
    }

    @Test(.timeLimit(.minutes(10)))
    func tenThousandTransactionsFromEightWritersArriveOnceInOrderWithoutRolledBackWork() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn)
        try daemon.start()
        let setup = try daemon.connect()
        try execute(setup, "feed", "CREATE TABLE item (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, n INTEGER NOT NULL)")
        let watcher = try daemon.connect()
        watcher.setReceiveTimeout(seconds: 60)
        let start = try watch(watcher, user: "feed", values: true)

        let socket = daemon.socketPath
        let group = DispatchGroup()
        let failures = Mutex<[String]>([])
        for writer in 0..<8 {
            DispatchQueue.global().async(group: group) {
                do {
                    let connection = try VarlinkConnection(path: socket)
                    for n in 0..<1250 {
                        _ = try connection.call("io.userstore.Store.Execute", ["user": "feed", "sql": "INSERT INTO item (writer, n) VALUES (?, ?)",
                                                                              "parameters": [.integer(Int64(writer)), .integer(Int64(n))]])
                    }
                } catch { failures.withLock { $0.append("writer \(writer): \(error)") } }
            }
        }
        // Beside them, transactions that roll back: none of their rows may be reported.
        DispatchQueue.global().async(group: group) {
            do {
                let connection = try VarlinkConnection(path: socket)
                for _ in 0..<50 {
                    let transaction = try connection.call("io.userstore.Store.Begin", ["user": "feed"])["transaction"]!.stringValue!
                    _ = try connection.call("io.userstore.Store.Execute", ["user": "feed", "sql": "INSERT INTO item (writer, n) VALUES (99, 0)",
                                                                          "transaction": .string(transaction)])
                    _ = try connection.call("io.userstore.Store.Rollback", ["transaction": .string(transaction)])
                }
            } catch { failures.withLock { $0.append("rollbacks: \(error)") } }
        }

        var seen = Set<[Int64]>()
        var position = start
        for _ in 0..<10_000 {
            let event = try next(watcher)
            let at = try #require(event["position"]?.integerValue)
            #expect(at == position + 1, "positions follow each other in commit order")
            position = at
            let changes = try #require(event["changes"]?.arrayValue)
            #expect(changes.count == 1)
            let change = try #require(changes.first?.objectValue)
            #expect(change["table"]?.stringValue == "item")
            #expect(change["operation"]?.stringValue == "insert")
            let values = try #require(change["values"]?.objectValue)
            let writer = try #require(values["writer"]?.integerValue)
            #expect(writer != 99, "a rolled-back insert was reported")
            #expect(values["id"]?.integerValue == change["rowid"]?.integerValue)
            seen.insert([writer, values["n"]?.integerValue ?? -1])
        }
        group.wait()
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        #expect(seen.count == 10_000, "every insert exactly once")
        // Nothing more: the store's position is the last one delivered.
        let check = try daemon.connect()
        #expect(try watch(check, user: "feed") == position)
    }

    @Test(.timeLimit(.minutes(5)))
    func aWatcherThatResumesFromItsLastPositionMissesNothingAcrossDisconnectsAndRestarts() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn)
        try daemon.start()
        let writer = try daemon.connect()
        try execute(writer, "resume", "CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT)")
        var watcher = try daemon.connect()
        let start = try watch(watcher, user: "resume")
        for n in 0..<5 { try execute(writer, "resume", "INSERT INTO note (body) VALUES (?)", [.string("a\(n)")]) }
        var last = start
        for _ in 0..<3 { last = try #require(try next(watcher)["position"]?.integerValue) }
        watcher.hangUp() // gone in the middle: two delivered events unread, and more to come

        for n in 0..<4 { try execute(writer, "resume", "UPDATE note SET body = ? WHERE id = ?", [.string("b\(n)"), .integer(Int64(n + 1))]) }
        try execute(writer, "resume", "DELETE FROM note WHERE id = 5")
        watcher = try daemon.connect()
        let position = try watch(watcher, user: "resume", since: last, values: true)
        #expect(position == start + 10)
        var operations: [String] = []
        for expected in (last + 1)...position {
            let event = try next(watcher)
            #expect(event["position"]?.integerValue == expected)
            let change = try #require(event["changes"]?.arrayValue?.first?.objectValue)
            operations.append(change["operation"]?.stringValue ?? "")
            if change["operation"]?.stringValue == "delete" { #expect(change["values"] == nil) }
        }
        #expect(operations == ["insert", "insert", "update", "update", "update", "update", "delete"])
        watcher.hangUp()

        // A restart, then more: a watch from the position before it misses nothing.
        #expect(daemon.stop() == 0)
        try daemon.start()
        let again = try daemon.connect()
        try execute(again, "resume", "INSERT INTO note (body) VALUES ('after restart')")
        let resumed = try daemon.connect()
        #expect(try watch(resumed, user: "resume", since: position) == position + 1)
        let event = try next(resumed)
        #expect(event["position"]?.integerValue == position + 1)
        #expect(event["changes"]?.arrayValue?.first?.objectValue?["operation"]?.stringValue == "insert")
    }

    @Test(.timeLimit(.minutes(5)))
    func positionLostNamesTheOldestPositionStillKept() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn + "  keepChanges: 10\n")
        try daemon.start()
        let writer = try daemon.connect()
        try execute(writer, "trim", "CREATE TABLE t (id INTEGER PRIMARY KEY)")
        // Watched once (the store records from then on), then 130 transactions nobody watches.
        let first = try daemon.connect()
        #expect(try watch(first, user: "trim") == 0)
        first.hangUp()
        for _ in 0..<130 { try execute(writer, "trim", "INSERT INTO t DEFAULT VALUES") }
        let watcher = try daemon.connect()
        do {
            _ = try watch(watcher, user: "trim", since: 1)
            Issue.record("since 1 should be lost after 130 transactions with keepChanges 10")
        } catch let error as VarlinkError {
            #expect(error.name == "io.userstore.Store.PositionLost")
            let oldest = try #require(error.parameters["oldest"]?.integerValue)
            #expect(error.parameters["user"]?.stringValue == "trim")
            #expect(oldest > 2 && oldest <= 130 - 10 + 1)
            // Resuming right before the oldest works and lists every kept transaction.
            let resumed = try daemon.connect()
            let position = try watch(resumed, user: "trim", since: oldest - 1)
            #expect(position == 130)
            for expected in oldest...position { #expect(try next(resumed)["position"]?.integerValue == expected) }
        }
    }

    /// A streamed call stays open as long as its client wants: a Watch (ended by a reply, as at a
    /// clean shutdown) and a streamed Query are not logged as slow requests, while a slow plain
    /// call still is.
    @Test func streamedCallsAreNotSlowRequests() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn + "slowRequestMilliseconds: 1\n")
        try daemon.start()
        let client = try daemon.connect()
        try execute(client, "alice", "CREATE TABLE t (x)")
        let watcher = try daemon.connect()
        _ = try watch(watcher, user: "alice")
        for value in 0..<20 { try execute(client, "alice", "INSERT INTO t VALUES (?)", [.integer(Int64(value))]) }
        for _ in 0..<20 { _ = try next(watcher) }
        var rows = 0
        try client.stream("io.userstore.Store.Query", ["user": "alice", "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) SELECT i FROM n"]) { reply in
            rows += reply["rows"]?.arrayValue?.count ?? 0
        }
        #expect(rows == 200_000)
        // The watch ends with a reply (Retry: its store was deleted), as it would at shutdown.
        _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "alice"])
        #expect(throws: VarlinkError.self) { _ = try next(watcher) }
        // A plain call that takes well over 1 ms: logged, so the log is where this test looks.
        _ = try client.call("io.userstore.Admin.Execute", ["user": "bob", "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000000) SELECT count(*) FROM n"])
        #expect(daemon.stop() == 0)
        let slow = daemon.stderr.split(separator: "\n").filter { $0.contains("event=slow-request") }
        #expect(slow.contains { $0.contains("io.userstore.Admin.Execute") }, "\(slow)")
        #expect(!slow.contains { $0.contains("io.userstore.Store.Watch") || $0.contains("io.userstore.Store.Query") }, "\(slow)")
    }

    @Test func watchWithoutMoreIsRefusedAndTablesFilter() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn)
        try daemon.start()
        let client = try daemon.connect()
        #expect(throws: VarlinkError.self) { _ = try client.call("io.userstore.Store.Watch", ["user": "alice"]) }
        try execute(client, "alice", "CREATE TABLE a (x)")
        try execute(client, "alice", "CREATE TABLE b (x)")
        let watcher = try daemon.connect()
        let start = try watch(watcher, user: "alice", tables: ["B"])
        try execute(client, "alice", "INSERT INTO a VALUES (1)")
        try execute(client, "alice", "INSERT INTO b VALUES (2)")
        let event = try next(watcher)
        #expect(event["position"]?.integerValue == start + 2, "the change to a is not this watcher's")
        #expect(event["changes"]?.arrayValue?.first?.objectValue?["table"]?.stringValue == "b")
    }
    @Test(.timeLimit(.minutes(5)))
    func aSlowWatcherIsDroppedWithItsPositionAndResumesWithoutLosingAnything() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn + "  maxBufferedBytes: 65536\n")
        try daemon.start()
        let writer = try daemon.connect()
        try execute(writer, "slow", "CREATE TABLE blob (id INTEGER PRIMARY KEY, body TEXT)")
        let watcher = try daemon.connect()
        watcher.setReceiveTimeout(seconds: 30)
        let start = try watch(watcher, user: "slow", values: true)
        // The watcher reads nothing while 2,000 transactions of ~2 KB each commit: far more than
        // the socket's buffers and maxBufferedBytes hold. The writer is never held up.
        let body = String(repeating: "x", count: 2000)
        for _ in 0..<2000 { try execute(writer, "slow", "INSERT INTO blob (body) VALUES (?)", [.string(body)]) }
        var last = start
        var dropped: VarlinkError?
        while dropped == nil {
            do {
                let event = try next(watcher)
                let position = try #require(event["position"]?.integerValue)
                #expect(position == last + 1)
                last = position
            } catch let error as VarlinkError {
                dropped = error
            }
        }
        #expect(dropped?.name == "io.userstore.Store.WatchTooSlow")
        #expect(dropped?.parameters["position"]?.integerValue == last, "the last position delivered")
        #expect(last < start + 2000, "dropped before the end")
        // Resumed from there: the rest, in order, nothing missing.
        let resumed = try daemon.connect()
        resumed.setReceiveTimeout(seconds: 30)
        #expect(try watch(resumed, user: "slow", since: last) == start + 2000)
        for expected in (last + 1)...(start + 2000) { #expect(try next(resumed)["position"]?.integerValue == expected) }
    }

    @Test(.timeLimit(.minutes(5)))
    func evictionBetweenTwoWatchesLosesNothingAndAnImportIsAReset() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn + "maxOpenStores: 1\n")
        try daemon.start()
        let client = try daemon.connect()
        try execute(client, "evicted", "CREATE TABLE t (x)")
        let first = try daemon.connect()
        let start = try watch(first, user: "evicted")
        try execute(client, "evicted", "INSERT INTO t VALUES (1)")
        #expect(try next(first)["position"]?.integerValue == start + 1)
        first.hangUp()
        // Another user's store takes the only slot: "evicted" is closed, then written again.
        try execute(client, "other", "CREATE TABLE u (y)")
        try execute(client, "evicted", "INSERT INTO t VALUES (2)")
        let second = try daemon.connect()
        #expect(try watch(second, user: "evicted", since: start + 1) == start + 2)
        #expect(try next(second)["position"]?.integerValue == start + 2)

        // A restore replaces the store under a watcher: the watch ends (Retry), and a watch from
        // the last position gets one reset, at a position past every earlier one.
        let backup = try #require(try client.call("io.userstore.Admin.Backup", ["user": "evicted"])["path"]?.stringValue)
        try execute(client, "evicted", "INSERT INTO t VALUES (3)") // position start + 3, then restored away
        #expect(try next(second)["position"]?.integerValue == start + 3)
        _ = try client.call("io.userstore.Admin.RestoreStore", ["user": "evicted", "backup": .string(backup)])
        #expect((try? next(second)) == nil, "the watch ended")
        let third = try daemon.connect()
        let position = try watch(third, user: "evicted", since: start + 3)
        #expect(position == start + 4)
        let reset = try next(third)
        #expect(reset["position"]?.integerValue == start + 4 && reset["reset"]?.boolValue == true)
    }


    @Test(.timeLimit(.minutes(5)))
    func aStoreNobodyWatchedRecordsNothing() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn)
        try daemon.start()
        let client = try daemon.connect()
        try execute(client, "quiet", "CREATE TABLE t (x)")
        for n in 0..<5 { try execute(client, "quiet", "INSERT INTO t VALUES (?)", [.integer(Int64(n))]) }
        let tables = try client.call("io.userstore.Store.Query", ["user": "quiet", "sql": "SELECT count(*) FROM sqlite_master WHERE name LIKE 'userstore_%'"])
        #expect(tables["rows"] == [[0]], "no change log in a store never watched")
        // The first watch starts the recording: it begins at position 0, and what follows counts.
        let watcher = try daemon.connect()
        #expect(try watch(watcher, user: "quiet") == 0)
        try execute(client, "quiet", "INSERT INTO t VALUES (99)")
        #expect(try next(watcher)["position"]?.integerValue == 1)
    }

    @Test(.timeLimit(.minutes(5)))
    func aMigrationOfAWatchedStoreIsOneReset() throws {
        let daemon = try DaemonHarness(migrations: ["0001_t.sql": "CREATE TABLE t (x);\n"], extraConfig: Self.watchOn)
        try daemon.start()
        let client = try daemon.connect()
        try execute(client, "migrated", "INSERT INTO t VALUES (1)")
        let watcher = try daemon.connect()
        let start = try watch(watcher, user: "migrated")
        try daemon.addMigration("0002_u.sql", "CREATE TABLE u (y);\n")
        _ = try client.call("io.userstore.Admin.Reload")
        try execute(client, "migrated", "INSERT INTO u VALUES (2)") // migrated first, on its next use
        let reset = try next(watcher)
        #expect(reset["position"]?.integerValue == start + 1 && reset["reset"]?.boolValue == true, "\(reset)")
        let insert = try next(watcher)
        #expect(insert["position"]?.integerValue == start + 2)
        #expect(insert["changes"]?.arrayValue?.first?.objectValue?["table"]?.stringValue == "u")
    }


    @Test(.timeLimit(.minutes(2)))
    func rowsASavepointRolledBackAreNotReported() throws {
        let daemon = try DaemonHarness(extraConfig: Self.watchOn)
        try daemon.start()
        let client = try daemon.connect()
        try execute(client, "saved", "CREATE TABLE t (x TEXT)")
        let watcher = try daemon.connect()
        let start = try watch(watcher, user: "saved", values: true)
        let transaction = try #require(try client.call("io.userstore.Store.Begin", ["user": "saved"])["transaction"])
        for sql in ["INSERT INTO t VALUES ('kept')", "/* a comment */ SAVEPOINT \"Inner\"", "INSERT INTO t VALUES ('undone')",
                    "ROLLBACK TO inner", "INSERT INTO t VALUES ('after')"] {
            _ = try client.call("io.userstore.Store.Execute", ["transaction": transaction, "sql": .string(sql)])
        }
        _ = try client.call("io.userstore.Store.Commit", ["transaction": transaction])
        let event = try next(watcher)
        #expect(event["position"]?.integerValue == start + 1)
        let values = (event["changes"]?.arrayValue ?? []).compactMap { $0.objectValue?["values"]?.objectValue?["x"]?.stringValue }
        #expect(values == ["kept", "after"], "\(event)")
    }

}
