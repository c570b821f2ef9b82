import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// Faults and hostile conditions: a full disk, damaged files, exhausted connections, crash
/// after crash. Each against the real daemon.
@Suite(.serialized) struct HardeningTests {
    func sqliteCheck(_ path: String) throws -> String {
        try run(["/usr/bin/sqlite3", path, "PRAGMA integrity_check"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Every store file under `directory`.
    func storeFiles(_ directory: String) -> [String] {
        (FileManager.default.enumerator(atPath: directory)?.compactMap { $0 as? String } ?? [])
            .filter { $0.hasSuffix(".sqlite") && $0.hasPrefix("stores/") }.map { directory + "/" + $0 }
    }

    // MARK: Disk full

    @Test(.timeLimit(.minutes(10)))
    func aFullDiskGivesStorageFailureKeepsServingAndRecovers() throws {
        let daemon = try DaemonHarness()
        try FileManager.default.createDirectory(atPath: daemon.dataDirectory, withIntermediateDirectories: true)
        let mounted = try run(["/bin/mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", daemon.dataDirectory])
        try #require(mounted.status == 0, "mount: \(mounted.stderr)")
        defer { _ = try? run(["/bin/umount", "-l", daemon.dataDirectory]) }
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "writer", "sql": "CREATE TABLE t (n INTEGER NOT NULL, pad TEXT NOT NULL)"])
        _ = try client.call("io.userstore.Store.Execute", ["user": "reader", "sql": "INSERT INTO notes (title) VALUES ('still here')"])
        // Fill most of the file system, then write until a write is refused.
        let filler = daemon.dataDirectory + "/filler"
        _ = try run(["/bin/dd", "if=/dev/zero", "of=\(filler)", "bs=64k", "count=40"])
        var acknowledged: [Int64] = []
        var refusal: VarlinkError?
        for n in Int64(0)..<100_000 where refusal == nil {
            refusal = varlinkError {
                _ = try client.call("io.userstore.Store.Execute", ["user": "writer", "sql": "INSERT INTO t VALUES (?, hex(randomblob(512)))", "parameters": [.integer(n)]])
                acknowledged.append(n)
            }
        }
        let full = try #require(refusal)
        #expect(full.name == "io.userstore.Store.StorageFailure" && full.parameters["sqliteCode"]?.integerValue.map { $0 & 0xFF } == 13, "\(full)")
        #expect(full.parameters["user"] == "writer")
        // Reads and other users are still served.
        #expect(try client.call("io.userstore.Store.Query", ["user": "writer", "sql": "SELECT count(*) FROM t"])["rows"] == [[.integer(Int64(acknowledged.count))]])
        #expect(try client.call("io.userstore.Store.Query", ["user": "reader", "sql": "SELECT title FROM notes"])["rows"] == [["still here"]])
        // A migration that runs out of space rolls back; the store stays at its version, no half copy.
        try daemon.addMigration("0007_big.sql", "CREATE TABLE big (b BLOB); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) INSERT INTO big SELECT randomblob(1000) FROM n;")
        _ = try client.call("io.userstore.Admin.Reload")
        let failed = varlinkError { _ = try client.call("io.userstore.Store.Open", ["user": "reader"]) }
        #expect(failed?.name == "io.userstore.Store.MigrationFailed" || failed?.name == "io.userstore.Store.StorageFailure", "\(String(describing: failed))")
        let partials = (FileManager.default.enumerator(atPath: daemon.dataDirectory)?.compactMap { $0 as? String } ?? []).filter { $0.hasSuffix(".partial") }
        #expect(partials.isEmpty, "\(partials)")
        // Space freed: writes and the migration work again, without a restart.
        try FileManager.default.removeItem(atPath: filler)
        try FileManager.default.removeItem(atPath: daemon.migrationsDirectory + "/0007_big.sql")
        try daemon.addMigration("0007_small.sql", "CREATE TABLE small (x);")
        _ = try client.call("io.userstore.Admin.Reload")
        _ = try client.call("io.userstore.Store.Execute", ["user": "writer", "sql": "INSERT INTO t VALUES (-1, 'after')"])
        #expect(try client.call("io.userstore.Store.Open", ["user": "reader"])["schemaVersion"] == 7)
        let present = try client.call("io.userstore.Store.Query", ["user": "writer", "sql": "SELECT n FROM t WHERE n >= 0 ORDER BY n"])["rows"]?.arrayValue ?? []
        #expect(present == acknowledged.map { [.integer($0)] }, "every acknowledged write is still there")
        daemon.stop()
        for file in storeFiles(daemon.dataDirectory) { #expect(try sqliteCheck(file) == "ok", "\(file)") }
    }

    // MARK: Damaged stores

    func digest(_ path: String) -> Data? { FileManager.default.contents(atPath: path) }

    @Test func damagedStoresAreRefusedNamedAndNeverChanged() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        let users = ["page", "truncated", "text", "wal", "healthy"]
        for user in users {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user),
                "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) INSERT INTO notes (title, body) SELECT 'note ' || i, hex(randomblob(300)) FROM n"])
        }
        daemon.stop()
        func path(_ user: String) -> String { storeFiles(daemon.dataDirectory).first { $0.hasSuffix("/\(user).sqlite") }! }
        // Random bytes over the notes' last page (dbstat: the change log shares the file), half
        // the file cut off, text, a garbage WAL.
        _ = try run(["/usr/bin/sqlite3", path("page"), "PRAGMA wal_checkpoint(TRUNCATE)"])
        let lastPage = try run(["/usr/bin/sqlite3", path("page"), "SELECT max(pageno) FROM dbstat WHERE name = 'notes'"])
        let pageNumber = try #require(UInt64(lastPage.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), "\(lastPage)")
        let page = try FileHandle(forUpdating: URL(fileURLWithPath: path("page")))
        try page.seek(toOffset: (pageNumber - 1) * 4096)
        try page.write(contentsOf: Data((0..<4096).map { _ in UInt8.random(in: 0...255) }))
        try page.close()
        let truncated = try FileHandle(forUpdating: URL(fileURLWithPath: path("truncated")))
        try truncated.truncate(atOffset: try truncated.seekToEnd() / 2)
        try truncated.close()
        try Data("these are not the bytes of a database\n".utf8).write(to: URL(fileURLWithPath: path("text")))
        try Data((0..<8192).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: path("wal") + "-wal"))
        let before = ["page", "truncated", "text", "wal"].flatMap { [path($0), path($0) + "-wal"] }.map { ($0, digest($0)) }

        try daemon.start()
        let again = try daemon.connect()
        for user in ["truncated", "text", "wal"] {
            let refused = varlinkError { _ = try again.call("io.userstore.Store.Open", ["user": .string(user)]) }
            #expect(refused?.name == "io.userstore.Store.StoreDamaged" && refused?.parameters["user"] == .string(user), "\(user): \(String(describing: refused))")
        }
        let scan = varlinkError { _ = try again.call("io.userstore.Store.Query", ["user": "page", "sql": "SELECT count(*), sum(length(body)) FROM notes"]) }
        #expect(scan?.name == "io.userstore.Store.StoreDamaged", "\(String(describing: scan))")
        // Once found damaged, refused for everything, even what would not read the page.
        #expect(varlinkError { _ = try again.call("io.userstore.Store.Query", ["user": "page", "sql": "SELECT 1"]) }?.name == "io.userstore.Store.StoreDamaged")
        #expect(try again.call("io.userstore.Store.Query", ["user": "healthy", "sql": "SELECT count(*) FROM notes"])["rows"] == [[300]])
        let verify = try run([userstorectlPath, "verify", "--all", "--json"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(verify.status == 1)
        let lines = verify.stdout.split(separator: "\n").compactMap { try? JSONParser().parse(String($0)) }
        for user in ["page", "truncated", "text", "wal"] {
            let line = lines.first { $0["user"] == .string(user) }
            #expect(line?["ok"] == false, "\(user) is not reported: \(verify.stdout)")
        }
        #expect(lines.first { $0["user"] == "healthy" }?["ok"] == true)
        daemon.stop()
        for (file, bytes) in before { #expect(digest(file) == bytes, "\(file) was changed") }
    }

    // MARK: Exhaustion

    @Test func connectionLimitsAndStalledClients() throws {
        let daemon = try DaemonHarness(extraConfig: """
            socketGroup: nogroup
            access:
              clientUsers: [nobody]
            limits:
              maxConnections: 6
              maxConnectionsPerUser: 3
              requestReadSeconds: 1
              idleConnectionSeconds: 2
            """)
        try daemon.start()
        chmod(daemon.directory.path + "/run", 0o755)
        let held = try (0..<3).map { _ in try daemon.connect() }
        for client in held { _ = try client.call("org.varlink.service.GetInfo") }
        // A fourth connection of the same Unix user is told at once.
        let fourth = try daemon.connect()
        let refused = try fourth.readReply()
        #expect(refused.error == "io.userstore.Store.LimitExceeded" && refused.parameters["limit"] == "connectionsPerUser")
        // Another Unix user still gets in.
        let script = """
            import socket, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            s.sendall(b'{"method":"org.varlink.service.GetInfo"}\\0')
            data = b""
            while not data.endswith(b"\\0"): data += s.recv(65536)
            print("ok" if data.startswith(b'{"parameters"') else data.decode())
            """
        let other = try run(["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, daemon.socketPath])
        #expect(other.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "\(other.stdout)\(other.stderr)")

        // Half a message, then nothing: told and closed after requestReadSeconds.
        let stalled = held[0]
        try stalled.send(raw: Array("{\"method\":\"org.varlink.service.GetI".utf8))
        let cut = try stalled.readReply()
        #expect(cut.error == "io.userstore.Store.LimitExceeded" && cut.parameters["limit"] == "requestSeconds")
        #expect(throws: VarlinkConnection.TransportError.self) { try stalled.readFrame() }
        // Nothing at all: closed after idleConnectionSeconds.
        #expect(throws: VarlinkConnection.TransportError.self) { try held[1].readFrame() }
        daemon.stop()
    }

    @Test(.timeLimit(.minutes(10)))
    func twoThousandStalledConnectionsDoNotStopOthers() throws {
        var files = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &files)
        files.rlim_cur = max(files.rlim_cur, min(files.rlim_max, 8192))
        setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &files)
        try #require(files.rlim_cur >= 4200)
        let daemon = try DaemonHarness(extraConfig: "limits:\n  maxConnections: 3000\n  maxConnectionsPerUser: 3000\n  requestReadSeconds: 120\n")
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Open", ["user": "bystander"])
        var stalled: [VarlinkConnection] = []
        for index in 0..<2000 {
            let connection = try daemon.connect()
            try connection.send(raw: Array("{\"method\":\"io.userstore.Store.Query\",\"parameters\":{\"user\":\"s\(index)\",".utf8))
            stalled.append(connection)
        }
        let client = try daemon.connect()
        for n in 0..<200 {
            #expect(try client.call("io.userstore.Store.Query", ["user": "bystander", "sql": "SELECT ?", "parameters": [.integer(Int64(n))]])["rows"] == [[.integer(Int64(n))]])
        }
        #expect((try client.call("io.userstore.Admin.Status")["connections"]?.integerValue ?? 0) >= 2001)
        stalled.removeAll()
        daemon.stop()
    }

    // MARK: Crash loop

    @Test(.timeLimit(.minutes(10)))
    func sigkillAgainAndAgainUnderWritesLosesNothing() throws {
        let result = try run([testPython, repositoryRoot + "/scripts/crash-loop.py", "--daemon", productsDirectory + "/userstored", "--kills", "12", "--json"])
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        let summary = try JSONParser().parse(result.stdout.split(separator: "\n").last.map(String.init) ?? "{}")
        #expect(summary["lostWrites"] == 0 && summary["storesChecked"] == 8)
        #expect((summary["acknowledgedWrites"]?.integerValue ?? 0) > 100)
        print("crash loop (short): \(result.stdout)")
    }

    /// The same with the daemon's own log to a folder and every write durable, then the disk
    /// lost: every store comes back from the replica with every durably acknowledged write
    /// (`make crash-s3` runs 1,000 kills on S3).
    @Test(.timeLimit(.minutes(10)))
    func sigkillAgainAndAgainUnderDurableWritesThenTheDiskLostLosesNothing() throws {
        let replica = try TemporaryDirectory()
        let result = try run([testPython, repositoryRoot + "/scripts/crash-loop.py", "--daemon", productsDirectory + "/userstored", "--kills", "12",
                              "--replica", "file://" + replica.path, "--json"])
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        let summary = try JSONParser().parse(result.stdout.split(separator: "\n").last.map(String.init) ?? "{}")
        #expect(summary["lostWrites"] == 0 && summary["storesChecked"] == 8 && summary["restoredFromReplica"] == true)
        #expect((summary["acknowledgedWrites"]?.integerValue ?? 0) > 50)
        print("crash loop (short, durable, disk lost): \(result.stdout)")
    }
}
