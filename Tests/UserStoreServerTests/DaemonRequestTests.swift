import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// The Store protocol — lazy open, value round trips, batches, concurrency, introspection — on
/// the live daemon over its socket, and on the same request path in-process over its socket and
/// over socket pairs (``Serving``); what needs the process itself (its journal lines, another
/// language's client) on the live daemon only.
@Suite(.serialized) struct DaemonRequestTests {
    @Test(arguments: Serving.allCases) func openMigratesANewUserAndValuesRoundTripExactly(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            let opened = try client.call("io.userstore.Store.Open", ["user": "alice"])
            #expect(opened["schemaVersion"] == 6 && opened["created"] == true && opened["migrated"] == true)
            #expect(opened["appliedVersions"] == [1, 2, 3, 4, 5, 6])
            let again = try client.call("io.userstore.Store.Open", ["user": "alice"])
            #expect(again["migrated"] == false && again["created"] == false && again["schemaVersion"] == 6)

            _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "CREATE TABLE v (k INTEGER PRIMARY KEY, value)"])
            let values: [JSONValue] = [
                .null, .integer(Int64.max), .integer(Int64.min), .integer(9_007_199_254_740_993), .integer(0),
                .real(2.0), .real(-0.5), .real(1e-300), .real(.infinity), .string(""), .string("nul\u{0}inside"),
                .string("emoji 🎉 and ünïcödé"), .object(["blob": .string(Data([0, 1, 254, 255]).base64EncodedString())]),
                .object(["blob": ""]),
            ]
            for (key, value) in values.enumerated() {
                let result = try client.call("io.userstore.Store.Execute", [
                    "user": "alice", "sql": "INSERT INTO v (k, value) VALUES (:k, :value)", "parameters": ["k": .integer(Int64(key)), "value": value],
                ])
                #expect(result["changes"] == 1 && result["lastInsertRowId"] == .integer(Int64(key)))
            }
            let rows = try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT value, typeof(value) FROM v ORDER BY k"])
            #expect(rows["columns"] == ["value", "typeof(value)"])
            let returned = rows["rows"]?.arrayValue?.compactMap { $0.arrayValue?.first } ?? []
            #expect(returned == values)
            let types = rows["rows"]?.arrayValue?.compactMap { $0.arrayValue?.last?.stringValue } ?? []
            #expect(types == ["null", "integer", "integer", "integer", "integer", "real", "real", "real", "real", "text", "text", "text", "blob", "blob"])

            // Tagged forms for clients whose JSON numbers are doubles; positional parameters.
            let tagged = try client.call("io.userstore.Store.Query", [
                "user": "alice", "sql": "SELECT ?, typeof(?), ?, typeof(?), ?",
                "parameters": [["integer": "9223372036854775807"], ["real": 3], ["real": 3], ["text": "t"], true],
            ])
            #expect(tagged["rows"] == [[.integer(Int64.max), "real", .real(3.0), "text", 1]])
        }
    }

    @Test(arguments: Serving.allCases) func aFailingStatementInsideATransactionalBatchLeavesNothingBehind(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            let batch = try client.call("io.userstore.Store.Batch", ["user": "bob", "statements": [
                ["sql": "INSERT INTO notes (title) VALUES (?)", "parameters": ["first"]],
                ["sql": "SELECT count(*) AS n FROM notes"],
            ]])
            let results = batch["results"]?.arrayValue ?? []
            #expect(results.count == 2)
            #expect(results.first?["changes"] == 1 && results.first?["columns"] == nil)
            #expect(results.last?["rows"] == [[1]] && results.last?["columns"] == ["n"])

            #expect {
                try client.call("io.userstore.Store.Batch", ["user": "bob", "statements": [
                    ["sql": "INSERT INTO notes (title) VALUES ('second')"],
                    ["sql": "INSERT INTO tags (name) VALUES ('x')"],
                    ["sql": "INSERT INTO tags (name) VALUES ('X')"], // UNIQUE COLLATE NOCASE
                ]])
            } throws: { error in
                let error = error as? VarlinkError
                return error?.name == "io.userstore.Store.SQLError" && error?.parameters["index"] == 2 && error?.parameters["code"] == 2067
            }
            let counts = try client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM tags)"])
            #expect(counts["rows"] == [[1, 0]])

            // Without a transaction, statements before the failing one stay applied.
            #expect(throws: VarlinkError.self) {
                try client.call("io.userstore.Store.Batch", ["user": "bob", "transaction": false, "statements": [
                    ["sql": "INSERT INTO tags (name) VALUES ('kept')"], ["sql": "INSERT INTO missing VALUES (1)"],
                ]])
            }
            #expect(try client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT name FROM tags"])["rows"] == [["kept"]])
            // The connection is not left inside a transaction.
            #expect(try client.call("io.userstore.Store.Execute", ["user": "bob", "sql": "INSERT INTO tags (name) VALUES ('after')"])["changes"] == 1)
        }
    }

    /// An Admin call and the named errors of bad calls, alike however the daemon is served.
    @Test(arguments: Serving.allCases) func adminCallsAndNamedErrorsAnswerAlike(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            _ = try client.call("io.userstore.Store.Open", ["user": "ann"])
            let status = try client.call("io.userstore.Admin.Status")
            #expect(status["openStores"] == 1 && status["daemonVersion"]?.stringValue?.isEmpty == false)
            func refusal(_ method: String, _ parameters: [String: JSONValue]) -> VarlinkError? {
                varlinkError { _ = try client.call(method, parameters) }
            }
            #expect(refusal("io.userstore.Store.Nope", [:])?.name == "org.varlink.service.MethodNotFound")
            #expect(refusal("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT 1", "bogus": 1]) == .invalidParameter("bogus"))
            #expect(refusal("io.userstore.Store.Open", ["user": ""])?.name == "io.userstore.Store.InvalidUser")
            #expect(refusal("io.userstore.Store.Query", ["user": "ann", "sql": "SELEC 1"])?.name == "io.userstore.Store.SQLError")
            #expect(refusal("io.userstore.Store.Commit", ["transaction": "none"])?.name == "io.userstore.Store.NoSuchTransaction")
            // The connection still serves after every refusal.
            #expect(try client.call("io.userstore.Store.Query", ["user": "ann", "sql": "SELECT 2"])["rows"] == [[2]])
        }
    }

    @Test func oneHundredSimultaneousOpensOfANewUserMigrateOnce() async throws {
        try await onThread {
            let daemon = try DaemonHarness(migrations: [
                "0001_runs.sql": "CREATE TABLE runs (n INTEGER);",
                "0002_once.sql": "INSERT INTO runs VALUES (1);",
            ])
            try daemon.start()
            let connections = try (0..<100).map { _ in try daemon.connect() }
            for connection in connections { try connection.send(VarlinkCall(method: "io.userstore.Store.Open", parameters: ["user": "crowd"])) }
            var migratedReplies = 0
            for connection in connections {
                let reply = try connection.readReply().checked()
                #expect(reply.parameters["schemaVersion"] == 2)
                if reply.parameters["migrated"] == true { migratedReplies += 1 }
            }
            #expect(migratedReplies >= 1)
            let rows = try connections[0].call("io.userstore.Store.Query", ["user": "crowd", "sql": "SELECT count(*) FROM runs"])
            #expect(rows["rows"] == [[1]])
            daemon.stop()
            #expect(daemon.stderr.components(separatedBy: "event=migration-started").count - 1 == 1)
        }
    }

    @Test(arguments: Serving.allCases) func sixteenClientsTimesTwentyFiveUsersInParallel(serving: Serving) async throws {
        try await serving.run { daemon in
            nonisolated(unsafe) let served = daemon // connect() only: thread-safe in every kind
            let done = Atomic(0)
            let failures = Mutex<[String]>([])
            DispatchQueue.concurrentPerform(iterations: 16) { clientIndex in
                do {
                    let client = try served.connect()
                    for userIndex in 0..<25 {
                        let user = JSONValue.string("u\(userIndex)")
                        _ = try client.call("io.userstore.Store.Execute", ["user": user, "sql": "INSERT INTO notes (title) VALUES (?)",
                                                                           "parameters": [.string("from client \(clientIndex)")]])
                        done.add(1, ordering: .relaxed)
                    }
                } catch {
                    failures.withLock { $0.append("client \(clientIndex): \(error)") }
                }
            }
            #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
            #expect(done.load(ordering: .relaxed) == 400)
            let client = try daemon.connect()
            for userIndex in 0..<25 {
                let rows = try client.call("io.userstore.Store.Query", ["user": .string("u\(userIndex)"), "sql": "SELECT count(*) FROM notes"])
                #expect(rows["rows"] == [[16]])
            }
        }
    }

    @Test func anIndependentVarlinkClientCanUseTheDaemon() async throws {
        try await onThread {
            let daemon = try DaemonHarness()
            try daemon.start()
            let script = """
                import varlink, sys
                with varlink.Client(address="unix:" + sys.argv[1]) as client:
                    with client.open("io.userstore.Store") as store:
                        opened = store.Open("py")
                        store.Execute("py", "INSERT INTO notes (title) VALUES (?)", ["from python"])
                        result = store.Query("py", "SELECT title FROM notes", None)
                        print(opened["schemaVersion"], result["rows"][0][0])
                """
            let result = try run([testPython, "-c", script, daemon.socketPath])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "6 from python")
            daemon.stop()
        }
    }

    @Test(arguments: Serving.allCases) func introspectionServesTheInterfaceFilesVerbatimAndTheyParseIndependently(serving: Serving) async throws {
        try await serving.run { daemon in
            let client = try daemon.connect()
            let info = try client.call("org.varlink.service.GetInfo")
            #expect(info["interfaces"] == ["org.varlink.service", "io.userstore.Store", "io.userstore.Admin"])
            for interface in ["io.userstore.Store", "io.userstore.Admin", "org.varlink.service"] {
                let description = try client.call("org.varlink.service.GetInterfaceDescription", ["interface": .string(interface)])["description"]?.stringValue ?? ""
                if interface != "org.varlink.service" {
                    let file = try String(contentsOfFile: repositoryRoot + "/Sources/UserStoreServer/Interfaces/\(interface).varlink", encoding: .utf8)
                    #expect(description == file)
                }
                let parsed = try run([testPython, "-c", "import varlink, sys; i = varlink.Interface(sys.stdin.read()); print(i.name)"], input: description)
                #expect(parsed.status == 0, "\(interface): \(parsed.stderr)")
                #expect(parsed.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == interface)
            }
            #expect {
                try client.call("org.varlink.service.GetInterfaceDescription", ["interface": "io.example.Nope"])
            } throws: { ($0 as? VarlinkError) == .interfaceNotFound("io.example.Nope") }
        }
    }
}
