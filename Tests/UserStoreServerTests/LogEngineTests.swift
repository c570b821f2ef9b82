import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import UserStoreReplication
import Varlink

/// The daemon's own replication (`replication.engine: log`) end to end, on a folder and on
/// SeaweedFS: the disaster (every durable write back after the disk is lost), a reopen that ships
/// nothing, commits a crash left unstored sent again, and an erase that leaves nothing of the
/// user in the bucket.
@Suite(.serialized) struct LogEngineTests {
    /// A daemon on the log engine over a folder (`kind` "file") or a bucket ("s3"), with what
    /// keeps them alive.
    final class Setup {
        let replica: TemporaryDirectory
        let server: SeaweedFS?
        /// With `proxied` ("s3" only): what stands between the daemon and the bucket, to hold,
        /// fail or cut its answers.
        let proxy: CuttableProxy?
        let daemon: DaemonHarness

        init(_ kind: String, extra: String = "", durableTimeoutMilliseconds: Int = 5000, proxied: Bool = false) throws {
            replica = try TemporaryDirectory()
            server = kind == "s3" ? try SeaweedFS() : nil
            try server?.createBucket("log")
            proxy = try server.flatMap { server in proxied ? try CuttableProxy(to: server.port) : nil }
            let url = server?.replicaURL(bucket: "log", prefix: "r", endpoint: proxy.map { "http://127.0.0.1:\($0.port)" }) ?? "file://" + replica.path
            daemon = try DaemonHarness(extraConfig: """
                replication:
                  replica: "\(url)"
                  engine: log
                  durableTimeoutMilliseconds: \(durableTimeoutMilliseconds)
                \(extra)
                """)
            daemon.environment = server?.environment ?? [:]
        }

        /// Every key of the replica (listed with boto3, or the folder's files), under its root.
        func allKeys() throws -> [String] {
            if let server { return try server.keys("log", prefix: "r/").map { String($0.dropFirst(2)) } }
            let root = replica.path + "/"
            return (FileManager.default.subpaths(atPath: root) ?? []).filter { path in
                var isFolder: ObjCBool = false
                return FileManager.default.fileExists(atPath: root + path, isDirectory: &isFolder) && !isFolder.boolValue
            }
        }

        /// Every object of the replica (read with boto3, or the folder's files), by key under its
        /// root; one deleted between the listing and its reading (the fold runs) left out.
        func allObjects() throws -> [String: [UInt8]] {
            var objects: [String: [UInt8]] = [:]
            let folder = try TemporaryDirectory()
            for key in try allKeys() {
                let file: String
                if let server {
                    file = folder.path + "/object"
                    unlink(file)
                    let result = try server.probe(["get", "log", "r/" + key, file])
                    if result.output.contains("NoSuchKey") { continue }
                    #expect(result.status == 0, "\(result.output)")
                } else {
                    file = replica.path + "/" + key
                }
                guard let data = FileManager.default.contents(atPath: file) else { continue }
                objects[key] = [UInt8](data)
            }
            return objects
        }

        /// The log's objects (`log/…`), by key.
        func logObjects() throws -> [String: [UInt8]] {
            try allObjects().filter { $0.key.hasPrefix("log/") && $0.key.hasSuffix(".usl") }
        }

        /// The folded per-user objects (`users/…`), by key.
        func foldedObjects() throws -> [String: [UInt8]] {
            try allObjects().filter { $0.key.hasPrefix("users/") }
        }

        /// Waits (at most 60 s) until the fold has emptied the log.
        func waitUntilFolded() throws {
            let deadline = ContinuousClock.now + .seconds(60)
            while try allKeys().contains(where: { $0.hasPrefix("log/") && $0.hasSuffix(".usl") }) {
                try #require(ContinuousClock.now < deadline, "the log was not folded within 60 s")
                Thread.sleep(forTimeInterval: 0.1)
            }
        }

        /// Every record of `user` in the log, in no particular order.
        func records(of user: String) throws -> [LogRecord] {
            try logObjects().values.flatMap { try LogSegment.decode($0).records.filter { $0.user == user } }
        }

        /// Every record of `user` in the log and in the folded objects.
        func allRecords(of user: String) throws -> [LogRecord] {
            try allObjects().filter { $0.key.hasSuffix(".usl") }.values.flatMap { try LogSegment.decode($0).records.filter { $0.user == user } }
        }

        /// Starts the daemon, stores `title` for `user` with a durable write, then makes the log
        /// unwritable (a file where its folder goes): the client, and what gives the folder back.
        func startThenLoseTheLog(after title: String = "before", of user: String) throws -> (client: VarlinkConnection, resume: @Sendable () -> Void) {
            try daemon.start()
            let client = try daemon.connect()
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(title)')", for: user, on: client, durable: true)
            return (client, try ReplicationTests.stall(replica: replica.path))
        }

        /// The host lost with its disk (SIGKILL, data directory removed), and a new one started on
        /// the same replica.
        func loseTheHost() throws {
            daemon.stop(signal: SIGKILL)
            try FileManager.default.removeItem(atPath: daemon.dataDirectory)
            try daemon.start()
        }
    }

    static func titles(_ user: String, _ client: VarlinkConnection) throws -> [String] {
        (try client.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT title FROM notes ORDER BY id"])["rows"]?.arrayValue ?? [])
            .compactMap { $0.arrayValue?.first?.stringValue }
    }

    /// 40 users, a durable write each, plain writes round-robin for 2 s, SIGKILL and the disk
    /// lost: every durable write and every plain write acknowledged more than a second before the
    /// kill comes back. Prints the figures.
    @Test(arguments: ["file", "s3"]) func everyUserComesBackFromTheLog(kind: String) throws {
        let setup = try Setup(kind)
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        let users = (0..<40).map { "user\($0)" }
        let durableStarted = ContinuousClock.now
        for user in users { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable')", for: user, on: client, durable: true) }
        let durableEach = (ContinuousClock.now - durableStarted) / users.count
        var acknowledged: [(user: String, title: String, at: ContinuousClock.Instant)] = []
        let until = ContinuousClock.now + .seconds(2)
        var round = 0
        while ContinuousClock.now < until {
            for user in users {
                try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('plain \(round)')", for: user, on: client)
                acknowledged.append((user, "plain \(round)", .now))
            }
            round += 1
        }
        let killedAt = ContinuousClock.now
        try setup.loseTheHost()
        let fresh = try setup.daemon.connect()
        var lost = 0, oldestLost = Duration.zero
        for user in users {
            #expect(try fresh.call("io.userstore.Store.Open", ["user": .string(user)])["created"] == false, "\(user) was created empty")
            let titles = Set(try Self.titles(user, fresh))
            #expect(titles.contains("durable"), "\(user)'s durable write is lost")
            for write in acknowledged where write.user == user && !titles.contains(write.title) {
                lost += 1
                oldestLost = max(oldestLost, killedAt - write.at)
            }
        }
        #expect(oldestLost < .seconds(1), "a plain write acknowledged \(oldestLost) before the kill is lost")
        print("log engine disaster (\(kind)): 40 users, durable write \(durableEach) each; \(acknowledged.count) plain writes, \(lost) lost, oldest lost \(oldestLost) before the kill")
    }

    /// A store closed (LRU) with everything stored and opened again sends nothing: its one base
    /// is the one of its creation, and a write after the reopen continues its stream.
    @Test func aReopenedStoreShipsNothingAgain() throws {
        let setup = try Setup("file", extra: "maxOpenStores: 2")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        try DurabilityTests.execute("CREATE TABLE blobs (b BLOB)", for: "ann", on: client)
        try DurabilityTests.execute("INSERT INTO blobs VALUES (randomblob(1000000))", for: "ann", on: client, durable: true)
        for user in ["bob", "cy"] { _ = try client.call("io.userstore.Store.Open", ["user": .string(user)]) } // ann closed
        #expect(try !(client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue ?? []).contains { $0["user"] == "ann" })
        let before = try setup.records(of: "ann")
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after the reopen')", for: "ann", on: client, durable: true)
        let after = try setup.records(of: "ann")
        #expect(after.filter { $0.kind == .base }.count == 1, "a reopen shipped the store whole again")
        let added = after.count - before.count
        #expect(added == 1 && after.map(\.pages.count).max() ?? 0 > 200, "\(added) records for one write after the reopen")
        #expect(Set(after.map(\.stream)).count == 1, "the reopen began a new stream")
        try setup.loseTheHost()
        #expect(try Self.titles("ann", try setup.daemon.connect()) == ["after the reopen"])
    }

    /// A new user ships once it is migrated: one base, and the migrated WAL as one commit record
    /// beside it — not a base of the empty store followed by a record per migration step (each
    /// in an object of its own as a rule: two PUTs per new user instead of one). The user comes
    /// back whole after the disk is lost.
    @Test func aNewUserShipsWholeOnceMigrated() throws {
        let setup = try Setup("file")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        let opened = try client.call("io.userstore.Store.Open", ["user": .string("ann")])
        #expect(opened["created"]?.boolValue == true)
        // Durable: every record of ann's before it is stored too.
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('first')", for: "ann", on: client, durable: true)
        let records = try setup.records(of: "ann")
        #expect(records.filter { $0.kind == .base }.count == 1)
        #expect(records.count <= 3, "\(records.map { "\($0.kind) \($0.since)→\($0.txid)" }): the migration shipped after the base")
        try setup.loseTheHost()
        let again = try setup.daemon.connect()
        #expect(try Self.titles("ann", again) == ["first"])
        #expect(try again.call("io.userstore.Store.Open", ["user": .string("ann")])["schemaVersion"] == opened["schemaVersion"])
    }

    /// No base leaves before the epoch its store is written under is on disk beside it: with
    /// the log's folder unwritable, a new user's base cannot be stored, and its position is
    /// there already, pending (a crash then must not leave a store whose base may be in the
    /// bucket with no epoch beside it: in a cluster, a copy another host wrote since could not
    /// be told from it). Once the log can be written again, the restarted daemon ships the base
    /// again, and the user comes back after the disk is lost.
    @Test func aBaseLeavesOnlyOnceItsEpochIsBesideTheStore() throws {
        let setup = try Setup("file")
        let (client, resume) = try setup.startThenLoseTheLog(after: "stored", of: "bob")
        _ = try client.call("io.userstore.Store.Open", ["user": .string("ann")])
        let position = try #require(LogPosition.load(try DurabilityTests.storePath("ann", setup.daemon)), "no position beside ann's store while its base is on its way")
        #expect(position.pending && position.stream != 0 && position.epoch > 0, "\(position)")
        #expect(try setup.records(of: "ann").isEmpty)
        setup.daemon.stop(signal: SIGKILL)
        resume()
        try setup.daemon.start()
        let again = try setup.daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after')", for: "ann", on: again, durable: true)
        #expect(try setup.records(of: "ann").filter { $0.kind == .base }.count == 1)
        try setup.loseTheHost()
        #expect(try Self.titles("ann", try setup.daemon.connect()) == ["after"])
    }

    /// A store written by another process while the daemon had it closed — `sqlite3` inserting
    /// a row large enough for overflow pages and checkpointing it into the file as it exits,
    /// leaving no WAL behind — ships a base at its next open: after the disk is lost, the store
    /// comes back exactly as it was (a later commit's pages alone would point at overflow pages
    /// the replica never got).
    @Test func aStoreChangedByAnotherProcessWhileClosedShipsABase() throws {
        let setup = try Setup("file")
        try setup.daemon.start()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "ann", on: try setup.daemon.connect(), durable: true)
        #expect(setup.daemon.stop() == 0)
        let path = try DurabilityTests.storePath("ann", setup.daemon)
        let outside = try run(["/usr/bin/sqlite3", path, "INSERT INTO notes (title, body) VALUES ('outside', hex(randomblob(30000)))"])
        #expect(outside.status == 0, "\(outside.stderr)")
        let walBytes = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
        #expect(walBytes == 0, "sqlite3 left a WAL of \(walBytes) bytes: not the case this test is about")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after')", for: "ann", on: client, durable: true)
        setup.daemon.stop(signal: SIGKILL) // the daemon holds the file exclusively
        let live = try DurabilityTests.contents(path)
        try setup.loseTheHost()
        #expect(try setup.daemon.connect().call("io.userstore.Store.Open", ["user": "ann"])["created"] == false)
        setup.daemon.stop()
        #expect(try DurabilityTests.contents(try DurabilityTests.storePath("ann", setup.daemon)) == live, "the store came back without what the other process wrote")
    }

    /// Commits a crash left unstored (the folder's log made unwritable, then the daemon
    /// SIGKILLed) are sent again when the store next opens, with the same txids: after the disk
    /// is then lost, every one of them comes back.
    @Test func commitsACrashLeftUnstoredAreSentAgainAtTheNextOpen() throws {
        let setup = try Setup("file")
        let (client, resume) = try setup.startThenLoseTheLog(after: "stored", of: "ann")
        for index in 0..<5 { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('unstored \(index)')", for: "ann", on: client) }
        setup.daemon.stop(signal: SIGKILL)
        resume()
        try setup.daemon.start()
        let again = try setup.daemon.connect()
        #expect(try Self.titles("ann", again).count == 6)
        // Everything in the bucket now (the reopen sent the WAL's commits): the disk lost.
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable after')", for: "ann", on: again, durable: true)
        try setup.loseTheHost()
        #expect(try Self.titles("ann", try setup.daemon.connect()) == ["stored", "unstored 0", "unstored 1", "unstored 2", "unstored 3", "unstored 4", "durable after"])
    }

    /// `DeleteStore` leaves nothing of the user in the bucket (every object listed and read with
    /// boto3): neither in its folded objects nor in the log's unfolded tail; nothing of a user
    /// whose name starts the same is touched, and the next host starts the user empty.
    @Test func anEraseLeavesNothingOfTheUserInTheBucket() throws {
        // Folded 5 s after they are stored: the tail written after the fold stays in the log
        // while the test lists it.
        let setup = try Setup("s3", extra: "  foldSeconds: 5")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        for user in ["ann", "anna"] {
            for index in 0..<3 { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(index)')", for: user, on: client, durable: true) }
        }
        try setup.waitUntilFolded()
        for user in ["ann", "anna"] { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('tail')", for: user, on: client, durable: true) }
        // Listed only (reading every object with boto3 takes longer than the fold waits).
        let keys = try setup.allKeys()
        #expect(keys.contains { $0.hasPrefix("log/") && $0.hasSuffix(".usl") }, "the log has no tail")
        #expect(keys.contains { $0.hasPrefix("users/") && $0.contains("/ann/") }, "ann has no folded object")
        _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "ann"])
        let left = try setup.allObjects()
        #expect(try setup.allRecords(of: "ann").isEmpty, "records of the erased user are left in the bucket")
        #expect(!left.keys.contains { $0.contains("/ann/") }, "folded objects of the erased user are left: \(left.keys.sorted())")
        #expect(left.values.allSatisfy { !String(decoding: $0, as: UTF8.self).contains("\"ann\"") })
        // anna is still in the bucket (whether her tail is in the log or already in her objects
        // races with the fold, and a reading can miss an object moved between listing and read:
        // what counts is that she comes back whole, below).
        let annas = try left.filter { $0.key.hasSuffix(".usl") }.values.flatMap { try LogSegment.decode($0).records.filter { $0.user == "anna" } }
        #expect(!annas.isEmpty, "nothing of anna is left: \(left.keys.sorted())")
        try setup.loseTheHost()
        let fresh = try setup.daemon.connect()
        #expect(try fresh.call("io.userstore.Store.Open", ["user": "ann"])["created"] == true)
        #expect(try Self.titles("anna", fresh) == ["0", "1", "2", "tail"])
    }

    /// With `foldSeconds: 0`, twelve rounds of durable writes, each folded before the next: every
    /// user's records leave the log for its own objects (deltas, then snapshots that supersede
    /// them), and after the disk is lost — just after a last write, which the fold may or may
    /// not have taken yet — every user comes back whole.
    @Test(arguments: ["file", "s3"]) func foldedUsersComeBackFromTheirObjectsAndTheTail(kind: String) throws {
        let setup = try Setup(kind, extra: "  foldSeconds: 0")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        let users = (0..<12).map { "user\($0)" }
        for round in 0..<12 {
            for user in users { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('round \(round)')", for: user, on: client, durable: true) }
            try setup.waitUntilFolded()
        }
        for user in users { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('tail')", for: user, on: client, durable: true) }
        let folded = try setup.foldedObjects()
        for user in users {
            let keys = folded.keys.filter { $0.contains("/\(user)/") }.sorted()
            #expect(keys.contains { $0.hasSuffix("-b.usl") }, "\(user) has no snapshot: \(keys)")
            #expect(keys.count <= 9, "\(user) keeps \(keys.count) folded objects: the snapshot did not supersede them")
        }
        try setup.loseTheHost()
        let fresh = try setup.daemon.connect()
        for user in users {
            #expect(try Self.titles(user, fresh) == (0..<12).map { "round \($0)" } + ["tail"], "\(user) did not come back whole")
        }
        print("log fold (\(kind)): 12 users, 12 folds each: \(folded.count) folded objects, \(folded.values.map(\.count).reduce(0, +)) bytes")
    }

    /// The fence: the first host cut off from the bucket (a proxy that stops forwarding) while
    /// it takes plain writes for bob; an operator gives the replica to a second host; the first,
    /// reconnected, uploads bob's late commits under its old epoch. They never count: a fresh
    /// host restores bob as the log stood when the second host fenced it, and ann with the second
    /// host's write.
    @Test func whatAnOldHolderUploadsAfterATakeOverNeverCounts() throws {
        let server = try SeaweedFS()
        try server.createBucket("fence")
        let proxy = try CuttableProxy(to: server.port)
        func daemon(_ endpoint: String? = nil) throws -> DaemonHarness {
            let daemon = try DaemonHarness(extraConfig: """
                replication:
                  replica: "\(server.replicaURL(bucket: "fence", prefix: "r", endpoint: endpoint))"
                  engine: log
                  durableTimeoutMilliseconds: 3000
                  leaseSeconds: 60
                """)
            daemon.environment = server.environment
            return daemon
        }
        let first = try daemon("http://127.0.0.1:\(proxy.port)")
        let second = try daemon()
        try first.start()
        let one = try first.connect()
        try WriterLeaseTests.durable("ann before", one)
        try WriterLeaseTests.durable("bob before", one, user: "bob")
        proxy.cut()
        for index in 0..<5 { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('late \(index)')", for: "bob", on: one) }
        try second.start()
        let two = try second.connect()
        #expect(try WriterLeaseTests.waitForLease(two, "standby"))
        let took = try run([userstorectlPath, "--socket", second.socketPath, "replication", "take-over"])
        #expect(took.status == 0, "\(took.stdout)\(took.stderr)")
        try WriterLeaseTests.durable("ann second", two)
        #expect(try server.keys("fence", prefix: "r/fences/").count == 2, "no fence for the second host's epoch")
        func uploads() throws -> (written: Int64, pending: Int64) {
            let log = try one.call("io.userstore.Admin.Status")["replication"]?["log"]
            return (log?["objectsWritten"]?.integerValue ?? -1, log?["pendingBytes"]?.integerValue ?? -1)
        }
        let writtenBefore = try uploads().written

        // The first host reaches the bucket again and uploads bob's late commits: its own count
        // of objects written says so (the objects may be gone by the time anyone lists them —
        // the second host deletes what its fence voids once it lists them).
        proxy.mend()
        let deadline = ContinuousClock.now + .seconds(60)
        var after = try uploads()
        while !(after.written > writtenBefore && after.pending == 0) && ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.1)
            after = try uploads()
        }
        try #require(after.written > writtenBefore && after.pending == 0, """
            the first host did not upload its late commits within 60 s of reconnecting \
            (\(writtenBefore) objects before, \(after) after):
            \(first.stderr)
            """)

        first.stop(signal: SIGKILL)
        second.stop(signal: SIGKILL)
        let fresh = try daemon()
        try fresh.start()
        let three = try fresh.connect()
        #expect(try WriterLeaseTests.waitForLease(three, "holding"))
        #expect(try Self.titles("bob", three) == ["bob before"], "what the old holder uploaded after the fence was applied")
        #expect(try Self.titles("ann", three) == ["ann before", "ann second"])
    }

    /// An existing deployment switching to the log: a user replicated by Litestream (its copy in
    /// Litestream's layout, shipped by `litestream replicate`), the disk lost, the daemon
    /// started — the user comes back from the Litestream copy once, ships a base to the log at its first open, and
    /// after the disk is lost again comes back from the log with every write.
    @Test func aCopyInLitestreamsLayoutIsRestoredOnceThenTheLogTakesOver() throws {
        let replica = try TemporaryDirectory()
        let daemon = try DaemonHarness(extraConfig: """
            replication:
              replica: "file://\(replica.path)"
              litestream: \(litestreamPath)
            """)
        // The replica's marker and writer lease, then ann's copy as Litestream shipped it.
        try daemon.start()
        #expect(daemon.stop() == 0)
        try LitestreamCopies.write("ann", titles: ["on litestream"], replica: "file://" + replica.path, folder: try LitestreamCopies.folder(of: "ann"))
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let client = try daemon.connect()
        #expect(try Self.titles("ann", client) == ["on litestream"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('on the log')", for: "ann", on: client, durable: true)
        let logged = (FileManager.default.subpaths(atPath: replica.path + "/log") ?? []).filter { $0.hasSuffix(".usl") }
        let records = try logged.flatMap { try LogSegment.decode([UInt8](try Data(contentsOf: URL(fileURLWithPath: replica.path + "/log/" + $0)))).records }
        #expect(records.contains { $0.user == "ann" && $0.kind == .base }, "the restored store shipped no base to the log")
        daemon.stop(signal: SIGKILL)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        #expect(try Self.titles("ann", try daemon.connect()) == ["on litestream", "on the log"])
        daemon.stop()
    }

    /// The bucket misbehaving while writes go on — every answer 300 ms late, every request
    /// answered 503, every PUT cut mid-body — through a proxy in front of SeaweedFS: plain writes
    /// (and a 2 MB one) are served; a durable write is acknowledged late (slow) or gets
    /// ReplicationUnavailable within its time-out and 10% (the others), Status naming the
    /// failure; once the bucket behaves a durable write is acknowledged within 30 s, and after
    /// the disk is lost the store is what it was at that acknowledgement. Prints the figures.
    @Test(arguments: ["slow", "503", "cut mid-body"]) func theBucketMisbehavesAndNothingAcknowledgedIsLost(fault: String) throws {
        let setup = try Setup("s3", durableTimeoutMilliseconds: 3000, proxied: true)
        let (proxy, daemon) = (setup.proxy!, setup.daemon)
        try daemon.start()
        let client = try daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "gus", on: client, durable: true)
        switch fault {
        case "slow": proxy.slow(milliseconds: 300)
        case "503": proxy.fail(status: 503)
        default: proxy.truncate()
        }
        try DurabilityTests.writeBlob(2_000_000, for: "gus", on: client)
        var durableWaits: [Duration] = []
        for index in 0..<90 {
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('plain \(index)')", for: "gus", on: client)
            guard index % 30 == 29 else { continue }
            let started = ContinuousClock.now
            let durable = { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable \(index)')", for: "gus", on: client, durable: true) }
            if fault == "slow" {
                _ = try durable()
            } else {
                #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") { _ = try durable() })
            }
            durableWaits.append(ContinuousClock.now - started)
        }
        if fault == "slow" {
            #expect(durableWaits.allSatisfy { $0 >= .milliseconds(300) && $0 < .milliseconds(3000) }, "\(durableWaits)")
        } else {
            #expect(durableWaits.allSatisfy { $0 <= .milliseconds(3300) }, "durable writes waited \(durableWaits.max()!) against a 3 s time-out")
            let status = try client.call("io.userstore.Admin.Status")["replication"]
            #expect(status?["state"] == "degraded", "\(String(describing: status))")
            let error = status?["lastError"]?.stringValue ?? ""
            #expect(fault == "503" ? error.contains("503") : !error.isEmpty, "\(String(describing: status))")
        }
        proxy.normal()
        let back = ContinuousClock.now
        var acknowledged = false
        while !acknowledged && ContinuousClock.now - back < .seconds(30) {
            acknowledged = (try? DurabilityTests.execute("INSERT INTO notes (title) VALUES ('caught up')", for: "gus", on: client, durable: true)) != nil
        }
        #expect(acknowledged, "no durable write acknowledged within 30 s of the bucket behaving again")
        print("bucket \(fault): durable waits \(durableWaits.map { "\($0)" }.joined(separator: ", ")), acknowledged again \(ContinuousClock.now - back) after it behaved")
        #expect(try DurabilityTests.waitUntilHealthy(client))
        try DurabilityTests.acknowledgeThenLoseTheHost("gus", daemon, client)
    }

    /// One user written without pause — each commit's record still uploading when the next
    /// commits — keeps its WAL near the checkpoint bound (1000 pages) instead of growing with every
    /// write; after the disk is lost every acknowledged write comes back. Before the deferred
    /// checkpoint the WAL held all 8000 commits here (100 MB; bound 8 MB).
    @Test(arguments: ["file", "s3"]) func aStoreWrittenWithoutPauseKeepsItsWALBounded(kind: String) throws {
        let setup = try Setup(kind)
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        try DurabilityTests.execute("CREATE TABLE rows (payload BLOB)", for: "max", on: client, durable: true)
        let wal = try DurabilityTests.storePath("max", setup.daemon) + "-wal"
        func walBytes() -> Int { (try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0 }
        var largest = 0
        for index in 0..<8000 {
            // About two pages a commit: a 3000-byte row.
            try DurabilityTests.execute("INSERT INTO rows VALUES (randomblob(3000))", for: "max", on: client)
            if index % 50 == 0 { largest = max(largest, walBytes()) }
        }
        let bound = 2 * 1000 * (4096 + 24) + 32
        print("\(kind): 8000 commits without pause, the WAL at most \(largest) bytes (bound \(bound))")
        #expect(largest <= bound, "the WAL reached \(largest) bytes while the store was written (bound \(bound))")
        try DurabilityTests.execute("INSERT INTO rows VALUES (x'1a57')", for: "max", on: client, durable: true)
        try setup.loseTheHost()
        let again = try setup.daemon.connect()
        let rows = try again.call("io.userstore.Store.Query", ["user": "max", "sql": "SELECT count(*), sum(payload = x'1a57') FROM rows"])["rows"]
        #expect(rows == [[8001, 1]])
    }

    /// `userstorectl restore USER --from-replica --offline --to PATH`, the daemon gone with its
    /// disk: userstorectl alone writes the user's store from the replica — its latest state, and
    /// its state at a point in time — a user the replica never held is `NoSuchStore` (exit 1), and
    /// an existing PATH is never overwritten.
    @Test(arguments: ["file", "s3"]) func userstorectlRestoresAUserFromTheReplicaWithNoDaemon(kind: String) throws {
        let setup = try Setup(kind)
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('first')", for: "ann", on: client, durable: true)
        let between = Date()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('second')", for: "ann", on: client, durable: true)
        setup.daemon.stop(signal: SIGKILL)
        try FileManager.default.removeItem(atPath: setup.daemon.dataDirectory)

        let out = try TemporaryDirectory()
        func restore(_ user: String, to name: String, _ extra: [String] = []) throws -> (status: Int32, stdout: String, stderr: String) {
            try run([userstorectlPath, "restore", user, "--from-replica", "--offline", "--config", setup.daemon.configPath,
                     "--to", out.path + "/" + name] + extra, environment: setup.server?.environment ?? [:])
        }
        func titles(_ name: String) throws -> [String] {
            try run(["/usr/bin/sqlite3", "-readonly", out.path + "/" + name, "SELECT title FROM notes ORDER BY id"]).stdout.split(separator: "\n").map(String.init)
        }
        let latest = try restore("ann", to: "ann.sqlite")
        #expect(latest.status == 0 && latest.stdout.contains("wrote the store of 'ann'"), "\(latest)")
        #expect(try titles("ann.sqlite") == ["first", "second"])
        let then = try restore("ann", to: "ann-then.sqlite", ["--timestamp", ReplicationTests.rfc3339(between)])
        #expect(then.status == 0, "\(then)")
        #expect(try titles("ann-then.sqlite") == ["first"])
        let nobody = try restore("nobody", to: "nobody.sqlite")
        #expect(nobody.status == 1 && nobody.stderr.contains("NoSuchStore"), "\(nobody)")
        #expect(!FileManager.default.fileExists(atPath: out.path + "/nobody.sqlite"))
        let again = try restore("ann", to: "ann.sqlite")
        #expect(again.status == 1 && again.stderr.contains("exists"), "\(again)")
        #expect(try titles("ann.sqlite") == ["first", "second"])
    }

    /// A point-in-time restore, then a write: the store starts a new stream, so the write never
    /// shares a txid with the commit the restore went back past — after the disk is lost the user
    /// has the write, not that commit.
    @Test func aWriteAfterAPointInTimeRestoreIsWhatComesBack() throws {
        let setup = try Setup("file")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "kim", on: client, durable: true)
        let between = Date()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after')", for: "kim", on: client, durable: true)
        let ctl = try run([userstorectlPath, "restore", "kim", "--from-replica", "--timestamp", ReplicationTests.rfc3339(between)],
                          environment: ["USERSTORE_SOCKET": setup.daemon.socketPath])
        #expect(ctl.status == 0, "\(ctl.stderr)")
        #expect(try Self.titles("kim", client) == ["before"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('later')", for: "kim", on: client, durable: true)
        try setup.loseTheHost()
        #expect(try Self.titles("kim", try setup.daemon.connect()) == ["before", "later"])
    }
}
