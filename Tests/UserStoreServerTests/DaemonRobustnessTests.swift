import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// Bad input from one client gets a named error or a closed connection; memory stays bounded;
/// everyone else is served throughout.
@Suite(.serialized) struct DaemonRobustnessTests {
    /// A well-behaved client querying in the background; counts its successes and failures.
    final class BystanderClient: Sendable {
        let successes = Atomic<Int>(0)
        let failures = Mutex<[String]>([])
        let running = Atomic<Bool>(true)
        let finished = DispatchSemaphore(value: 0)

        init(socket: String) {
            Thread { [self] in
                defer { finished.signal() }
                guard let client = try? VarlinkConnection(path: socket) else { failures.withLock { $0.append("connect") }; return }
                client.setReceiveTimeout(seconds: 30)
                while running.load(ordering: .relaxed) {
                    do {
                        let rows = try client.call("io.userstore.Store.Query", ["user": "bystander", "sql": "SELECT count(*) FROM notes"])
                        if rows["rows"] == nil { failures.withLock { $0.append("no rows") } }
                        successes.add(1, ordering: .relaxed)
                    } catch {
                        failures.withLock { $0.append("\(error)") }
                        return
                    }
                }
            }.start()
        }

        func stop() -> (Int, [String]) {
            running.store(false, ordering: .relaxed)
            finished.wait()
            return (successes.load(ordering: .relaxed), failures.withLock { $0 })
        }
    }

    @Test func badInputGetsNamedErrorsOrAClosedConnectionWhileOthersAreServed() throws {
        let daemon = try DaemonHarness(extraConfig: "limits:\n  maxRequestBytes: 1048576\n")
        try daemon.start()
        let bystander = BystanderClient(socket: daemon.socketPath)
        let baselineKiB = daemon.residentKiB

        func reply(to bytes: [UInt8]) throws -> VarlinkReplyMessage {
            let client = try daemon.connect()
            try client.send(raw: bytes)
            return try client.readReply()
        }
        // Invalid JSON, garbage bytes, a non-object, a call without a method: named errors,
        // and the connection stays usable.
        for garbage in [Array("{not json".utf8), [0xFF, 0xFE, 0x01, 0x02], Array("[1,2,3]".utf8), Array("{\"parameters\":{}}".utf8)] {
            let client = try daemon.connect()
            try client.send(raw: garbage + [0])
            #expect(try client.readReply().error == "io.userstore.Store.InvalidRequest")
            #expect(try client.call("org.varlink.service.GetInfo")["product"] == "userstored")
        }
        // Huge nesting: refused by the parser's depth limit, not by a crashed stack.
        let nested = Array(repeating: UInt8(ascii: "["), count: 100_000) + Array(repeating: UInt8(ascii: "]"), count: 100_000)
        #expect(try reply(to: nested + [0]).error == "io.userstore.Store.InvalidRequest")
        // Unknown method and interface, missing and mistyped parameters.
        #expect(try reply(to: call("io.userstore.Store.Frobnicate", [:])).error == "org.varlink.service.MethodNotFound")
        #expect(try reply(to: call("io.example.Nope.Method", [:])).error == "org.varlink.service.InterfaceNotFound")
        let missing = try reply(to: call("io.userstore.Store.Query", ["user": "x"]))
        #expect(missing.error == "org.varlink.service.InvalidParameter" && missing.parameters["parameter"] == "sql")
        let mistyped = try reply(to: call("io.userstore.Store.Open", ["user": 42]))
        #expect(mistyped.error == "org.varlink.service.InvalidParameter" && mistyped.parameters["parameter"] == "user")
        let badUser = try reply(to: call("io.userstore.Store.Open", ["user": "../etc/passwd"]))
        #expect(badUser.error == "io.userstore.Store.InvalidUser")
        let wrongCount = try reply(to: call("io.userstore.Store.Query", ["user": "x", "sql": "SELECT ?, ?", "parameters": [1]]))
        #expect(wrongCount.error == "org.varlink.service.InvalidParameter")
        let twoStatements = try reply(to: call("io.userstore.Store.Execute", ["user": "x", "sql": "SELECT 1; SELECT 2"]))
        #expect(twoStatements.error == "io.userstore.Store.SQLError")

        // The calls the router serves read their parameters in place from the parsed message:
        // mistyped ones named, escapes read, `parameters` that is not an object refused.
        let mistypedAdmin = try reply(to: call("io.userstore.Admin.Plan", ["user": 42]))
        #expect(mistypedAdmin.error == "org.varlink.service.InvalidParameter" && mistypedAdmin.parameters["parameter"] == "user")
        let mixedList = try reply(to: call("io.userstore.Admin.Migrate", ["users": ["x", 1]]))
        #expect(mixedList.error == "org.varlink.service.InvalidParameter" && mixedList.parameters["parameter"] == "users")
        let escaped = try reply(to: Array(#"{"method":"io.userstore.Admin.Plan","parameters":{"user":"esc\u0061ped"}}"#.utf8) + [0])
        #expect(escaped.error == nil && escaped.parameters["user"] == "escaped")
        let notAnObject = try reply(to: Array(#"{"method":"io.userstore.Admin.Status","parameters":5}"#.utf8) + [0])
        #expect(notAnObject.error == "org.varlink.service.InvalidParameter" && notAnObject.parameters["parameter"] == "parameters")
        #expect(try reply(to: Array(#"{"method":5}"#.utf8) + [0]).error == "io.userstore.Store.InvalidRequest")

        // A truncated message (no NUL) followed by a close: nothing to answer, nothing breaks.
        do {
            let client = try daemon.connect()
            try client.send(raw: Array("{\"method\":\"io.userstore.Store.Open\",\"param".utf8))
        }
        // An oversized message: 300 MiB without a NUL. The daemon answers LimitExceeded and
        // closes after at most maxRequestBytes; it never buffers the rest.
        let oversized = try daemon.connect()
        let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 1 << 20)
        var sent = 0
        do {
            while sent < 300 << 20 {
                try oversized.send(raw: chunk)
                sent += chunk.count
            }
        } catch {}
        #expect(sent < 300 << 20) // the daemon hung up long before
        let limit = try oversized.readReply()
        #expect(limit.error == "io.userstore.Store.LimitExceeded" && limit.parameters["limit"] == "requestBytes")
        // Under AddressSanitizer (scripts/sanitize.sh sets ASAN_OPTIONS) freed memory sits in its
        // quarantine and every allocation has shadow memory: RSS says nothing there.
        if ProcessInfo.processInfo.environment["ASAN_OPTIONS"] == nil {
            #expect(daemon.residentKiB - baselineKiB < 64 * 1024)
        }

        let (successes, failures) = bystander.stop()
        #expect(failures.isEmpty)
        #expect(successes > 0)
        // Still serving.
        #expect(try daemon.connect().call("io.userstore.Store.Open", ["user": "after"])["schemaVersion"] == 6)
        #expect(daemon.stop() == 0)
    }

    /// Parameters are exact and defined: an integer beyond 64 bits anywhere in a call, or a
    /// parameter the method does not define, is `InvalidParameter` naming it, on every path (a
    /// ready store's fast path, a new store, a transaction, an admin call), and nothing runs;
    /// the 64-bit boundaries and large reals come back exactly. A refused input is quoted by its
    /// first 64 bytes and its length.
    @Test func parametersAreExactAndDefinedAndRefusalsQuoteLittle() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "CREATE TABLE t (x)"])
        func raw(_ text: String) throws -> VarlinkReplyMessage {
            try client.send(raw: Array(text.utf8) + [0])
            return try client.readReply()
        }
        func refused(_ reply: VarlinkReplyMessage) -> String? {
            reply.error == "org.varlink.service.InvalidParameter" ? reply.parameters["parameter"]?.stringValue : nil
        }
        // Integers outside the signed 64-bit range, as positional and named SQL parameters.
        for number in ["9223372036854775808", "18446744073709551616", "-9223372036854775809", "100000000000000000000000"] {
            #expect(refused(try raw(#"{"method":"io.userstore.Store.Query","parameters":{"user":"alice","sql":"SELECT ?","parameters":[\#(number)]}}"#)) == "parameters[0]")
            #expect(refused(try raw(#"{"method":"io.userstore.Store.Execute","parameters":{"user":"alice","sql":"INSERT INTO t VALUES (:n)","parameters":{"n":\#(number)}}}"#)) == "parameters.n")
            #expect(refused(try raw(#"{"method":"io.userstore.Store.Batch","parameters":{"user":"alice","statements":[{"sql":"INSERT INTO t VALUES (?)","parameters":[1,\#(number)]}]}}"#)) == "statements[0].parameters[1]")
            #expect(refused(try raw(#"{"method":"io.userstore.Admin.ListStores","parameters":{"limit":\#(number)}}"#)) == "limit")
        }
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM t"])["rows"] == [[0]])
        // The boundaries themselves, and large reals, come back exactly.
        let exact = try raw(#"{"method":"io.userstore.Store.Query","parameters":{"user":"alice","sql":"SELECT ?, ?, ?, ?, ?","parameters":[9223372036854775807,-9223372036854775808,1e300,-1.7976931348623157e308,2.5e-300]}}"#)
        #expect(exact.parameters["rows"] == [[.integer(.max), .integer(.min), .real(1e300), .real(-1.7976931348623157e308), .real(2.5e-300)]])
        // Parameters the method does not define: on a ready store (the fast path), a new store,
        // a transaction's calls, an admin call. The misspelt `durable` runs nothing.
        #expect(refused(try raw(#"{"method":"io.userstore.Store.Execute","parameters":{"user":"alice","sql":"INSERT INTO t VALUES (1)","durabel":true}}"#)) == "durabel")
        #expect(refused(try raw(#"{"method":"io.userstore.Store.Query","parameters":{"user":"alice","sql":"SELECT 1","bogus":1}}"#)) == "bogus")
        #expect(refused(try raw(#"{"method":"io.userstore.Store.Open","parameters":{"user":"newcomer","bogus":1}}"#)) == "bogus")
        #expect(refused(try raw(#"{"method":"io.userstore.Store.Begin","parameters":{"user":"alice","bogus":1}}"#)) == "bogus")
        #expect(refused(try raw(#"{"method":"io.userstore.Admin.Status","parameters":{"verbose":true}}"#)) == "verbose")
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM t"])["rows"] == [[0]])
        let transaction = try client.call("io.userstore.Store.Begin", ["user": "alice"])["transaction"]!
        #expect(refused(try raw(#"{"method":"io.userstore.Store.Commit","parameters":{"transaction":"\#(transaction.stringValue!)","bogus":1}}"#)) == "bogus")
        _ = try client.call("io.userstore.Store.Rollback", ["transaction": transaction])
        // A negative rollback target is a typo, not "undo everything".
        #expect(refused(try raw(#"{"method":"io.userstore.Admin.Rollback","parameters":{"user":"alice","toVersion":-5}}"#)) == "toVersion")
        #expect(try client.call("io.userstore.Store.Open", ["user": "alice"])["schemaVersion"] == 6)
        // Every defined parameter is accepted (the interface file is the list).
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO t VALUES (?)", "parameters": [1], "durable": false])
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM t"])["rows"] == [[1]])
        // A 10,000-byte user ID, method name, unknown parameter name: quoted by 64 bytes and the length.
        let long = String(repeating: "a", count: 10_000)
        for reply in [try raw(#"{"method":"io.userstore.Store.Open","parameters":{"user":"\#(long)!"}}"#),
                      try raw(#"{"method":"io.userstore.Store.\#(long)","parameters":{}}"#),
                      try raw(#"{"method":"io.userstore.Store.Open","parameters":{"user":"alice","\#(long)":1}}"#)] {
            let quoted = reply.parameters.values.compactMap(\.stringValue).first { $0.hasPrefix("aaaa") || $0.contains("aaaa") }
            #expect(quoted?.utf8.count ?? .max < 128, "\(reply.error ?? "") \(quoted?.prefix(100) ?? "")")
            #expect(quoted?.hasSuffix("bytes)") == true)
        }
        #expect(daemon.stop() == 0)
    }

    /// What io.userstore.Store.varlink says Query runs: any statement, writes included —
    /// INSERT ... RETURNING returns its rows; a write without RETURNING returns none and is applied.
    @Test func queryRunsWritesAsTheInterfaceSays() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        let inserted = try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "INSERT INTO notes (title) VALUES ('a'), ('b') RETURNING title"])
        #expect(inserted["rows"] == [["a"], ["b"]])
        let deleted = try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "DELETE FROM notes WHERE title = 'a'"])
        #expect(deleted["rows"] == [])
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT title FROM notes"])["rows"] == [["b"]])
        #expect(daemon.stop() == 0)
    }

    @Test func aSlowStatementIsInterruptedAndAHugeResultRefused() throws {
        let daemon = try DaemonHarness(extraConfig: "limits:\n  statementTimeoutMilliseconds: 200\n  maxResponseBytes: 65536\n")
        try daemon.start()
        let client = try daemon.connect()
        let endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
        #expect {
            try client.call("io.userstore.Store.Query", ["user": "slow", "sql": .string(endless)])
        } throws: { error in
            let error = error as? VarlinkError
            return error?.name == "io.userstore.Store.LimitExceeded" && error?.parameters["limit"] == "statementMilliseconds"
        }
        let big = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) SELECT i, 'padding padding' FROM n"
        #expect {
            try client.call("io.userstore.Store.Query", ["user": "slow", "sql": .string(big)])
        } throws: { ($0 as? VarlinkError)?.parameters["limit"] == "responseBytes" }
        #expect(try client.call("io.userstore.Store.Query", ["user": "slow", "sql": "SELECT 1"])["rows"] == [[1]])
        daemon.stop()
    }

    @Test func isolationRefusesOtherFilesAndTheBookkeeping() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Open", ["user": "victim"])
        _ = try client.call("io.userstore.Store.Open", ["user": "attacker"])
        let victimPath = try #require(FileManager.default.enumerator(atPath: daemon.dataDirectory + "/stores")?
            .compactMap { $0 as? String }.first { $0.hasSuffix("/victim.sqlite") })
        let attempts: [String] = [
            "ATTACH DATABASE '\(daemon.dataDirectory)/stores/\(victimPath)' AS other",
            "VACUUM INTO '\(daemon.directory.path)/copy.sqlite'",
            "UPDATE app_version SET schema_version = 99",
            "DELETE FROM schema_migrations",
            "INSERT INTO schema_migrations (version, name, checksum, applied_at, duration_usec, app_version) VALUES (99, 'x', 'x', 'x', 0, 'x')",
            "DROP TABLE app_version",
            "ALTER TABLE schema_migrations ADD COLUMN x",
            "PRAGMA user_version = 99",
            "PRAGMA foreign_keys = OFF",
            "PRAGMA writable_schema = ON",
            "BEGIN",
            "SELECT load_extension('/tmp/evil.so')",
            "CREATE TEMP TRIGGER t AFTER INSERT ON notes BEGIN DELETE FROM notes; END",
        ]
        for sql in attempts {
            #expect(throws: VarlinkError.self, "\(sql)") {
                try client.call("io.userstore.Store.Execute", ["user": "attacker", "sql": .string(sql)])
            }
        }
        #expect(!FileManager.default.fileExists(atPath: daemon.directory.path + "/copy.sqlite"))
        // A refused statement says so, unlike a refused caller.
        #expect {
            try client.call("io.userstore.Store.Execute", ["user": "attacker", "sql": "DELETE FROM schema_migrations"])
        } throws: { error in
            let error = error as? VarlinkError
            return error?.name == "io.userstore.Store.PermissionDenied" && error?.parameters["statement"] == true
        }
        // Reading the bookkeeping and introspection are fine.
        #expect(try client.call("io.userstore.Store.Query", ["user": "attacker", "sql": "SELECT schema_version FROM app_version"])["rows"] == [[6]])
        #expect(try client.call("io.userstore.Store.Query", ["user": "attacker", "sql": "PRAGMA user_version"])["rows"] == [[6]])
        #expect(try client.call("io.userstore.Store.Query", ["user": "attacker", "sql": "PRAGMA table_info(notes)"])["rows"]?.arrayValue?.count == 5)
        #expect(try client.call("io.userstore.Admin.Verify", ["users": ["attacker", "victim"]])["failures"] == 0)
        daemon.stop()
    }

    @Test func peersOutsideTheAccessRulesAreRefused() throws {
        let daemon = try DaemonHarness(extraConfig: "socketGroup: nogroup\naccess:\n  clientUsers: [daemon]\n")
        try daemon.start()
        chmod(daemon.directory.path + "/run", 0o755)
        let script = """
            import socket, json, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            for method in sys.argv[2:]:
                parameters = {"user": "someone"} if method.endswith(".Open") else {}
                s.sendall(json.dumps({"method": method, "parameters": parameters}).encode() + b"\\0")
                data = b""
                while not data.endswith(b"\\0"): data += s.recv(65536)
                print(json.loads(data[:-1]).get("error", "ok"))
            """
        let methods = ["io.userstore.Store.Open", "io.userstore.Admin.Status", "org.varlink.service.GetInfo"]
        let nobody = try run(["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, daemon.socketPath] + methods)
        #expect(nobody.status == 0, "\(nobody.stderr)")
        #expect(nobody.stdout.split(separator: "\n") == ["io.userstore.Store.PermissionDenied", "io.userstore.Store.PermissionDenied", "ok"])
        let client = try run(["/usr/bin/setpriv", "--reuid=daemon", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, daemon.socketPath] + methods)
        #expect(client.stdout.split(separator: "\n") == ["ok", "io.userstore.Store.PermissionDenied", "ok"])
        daemon.stop()
    }

    @Test func perUnixUserStoresConfineAClientToItsOwnUID() throws {
        let daemon = try DaemonHarness(extraConfig: "socketGroup: nogroup\naccess:\n  clientUsers: [nobody]\n  perUnixUserStores: true\n")
        try daemon.start()
        chmod(daemon.directory.path + "/run", 0o755)
        let script = """
            import socket, json, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            for user in sys.argv[2:]:
                params = {} if user == "-" else {"user": user}
                s.sendall(json.dumps({"method": "io.userstore.Store.Open", "parameters": params}).encode() + b"\\0")
                data = b""
                while not data.endswith(b"\\0"): data += s.recv(65536)
                reply = json.loads(data[:-1])
                print(reply.get("error") or reply["parameters"]["user"])
            """
        let result = try run(["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, daemon.socketPath, "-", "65534", "alice"])
        #expect(result.stdout.split(separator: "\n") == ["65534", "65534", "io.userstore.Store.PermissionDenied"], "\(result.stderr)")
        daemon.stop()
    }

    static func call(_ method: String, _ parameters: [String: JSONValue]) -> [UInt8] {
        var writer = JSONWriter()
        writer.write(VarlinkCall(method: method, parameters: parameters).message)
        return writer.bytes + [0]
    }

    func call(_ method: String, _ parameters: [String: JSONValue]) -> [UInt8] { Self.call(method, parameters) }
}
