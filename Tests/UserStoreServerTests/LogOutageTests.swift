import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// The log when it cannot be written (its folder in the way): stores served, a store evicted
/// and the daemon stopped meanwhile, nothing acknowledged lost.
extension LogEngineTests {
    /// The log's folder made unwritable while writes go on: plain writes are served, durable ones
    /// get ReplicationUnavailable, the daemon reports the outage once (`replication-degraded`);
    /// once the folder is back every commit kept meanwhile is written, in order
    /// (`replication-recovered`), a durable write is acknowledged, and after the disk is lost
    /// every write comes back.
    @Test func aLogThatCannotBeWrittenDegradesAndRecovers() throws {
        let setup = try Setup("file")
        let (client, resume) = try setup.startThenLoseTheLog(of: "ann")
        for index in 0..<20 { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('during \(index)')", for: "ann", on: client) }
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('durable during')", for: "ann", on: client, durable: true)
        })
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "degraded" && ($0["log"]?["pendingBytes"]?.integerValue ?? 0) > 0 })
        // The lag (Litestream's field, now the log's): the oldest unstored commit waited through
        // the durable write's time-out at least.
        func lag() throws -> Double {
            switch try client.call("io.userstore.Admin.Status")["replication"]?["maxLagSeconds"] {
            case .real(let seconds)?: seconds
            case .integer(let seconds)?: Double(seconds)
            default: -1
            }
        }
        let stalledLag = try lag()
        #expect(stalledLag >= 1, "maxLagSeconds \(stalledLag) while the log could not be written")
        resume()
        // Everything stored: no lag (the last object may still be in flight when nothing waits).
        #expect(try DurabilityTests.waitForReplication(client) {
            $0["state"] == "ok" && $0["log"]?["pendingBytes"] == 0 && ($0["maxLagSeconds"] == .real(0) || $0["maxLagSeconds"] == .integer(0))
        })
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after')", for: "ann", on: client, durable: true)
        let stderr = setup.daemon.stderr
        #expect(stderr.components(separatedBy: "event=replication-degraded").count == 2, "one replication-degraded per outage")
        #expect(stderr.contains("event=replication-recovered"))
        try setup.loseTheHost()
        #expect(try Self.titles("ann", try setup.daemon.connect()) == ["before"] + (0..<20).map { "during \($0)" } + ["durable during", "after"])
    }

    /// A store closed (evicted) while the log cannot be written: it closes at once, not after
    /// the durable time-out (the new user's request waits for that close), with its WAL kept —
    /// its last commits not stored — and, reopened once the log can be written again, ships what
    /// the WAL holds past its stored position; a durable write after that covers everything, and
    /// after the disk is lost the store is what it was at that acknowledgement.
    @Test func aStoreEvictedWhileTheLogCannotBeWrittenLosesNothing() throws {
        let setup = try Setup("file", extra: "maxOpenStores: 2", durableTimeoutMilliseconds: 600_000)
        let (client, resume) = try setup.startThenLoseTheLog(of: "fay")
        try DurabilityTests.writeBlob(5_242_880, for: "fay", on: client)
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('while the log is away')", for: "fay", on: client)
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "degraded" })
        // Two other users: fay, least recently used, is closed — without waiting the ten minutes
        // a durable write would wait for the log.
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"])
        let evicting = ContinuousClock.now
        _ = try client.call("io.userstore.Store.Open", ["user": "hal"])
        let waited = ContinuousClock.now - evicting
        #expect(waited < .seconds(60), "the new user's request waited \(waited) for the evicted store's close")
        let open = try client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
        #expect(!open.contains("fay"), "fay's store was not closed: \(open)")
        let wal = try DurabilityTests.storePath("fay", setup.daemon) + "-wal"
        #expect(((try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0) > 5_242_880, "closing dropped the WAL holding what the log did not store")
        resume()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('reopened')", for: "fay", on: client)
        try DurabilityTests.acknowledgeThenLoseTheHost("fay", setup.daemon, client)
    }

    /// A stop while the log cannot be written ends: the stores close at once, the stop waits
    /// for the log once (the durable time-out) and gives its object up — it used to retry it
    /// without pause, at full CPU, and never ended. What the stores committed is in their WALs:
    /// started again with the log back, the daemon ships it, and after the disk is lost every
    /// write is back.
    @Test func aStopWhileTheLogCannotBeWrittenEndsAndLosesNothing() throws {
        let setup = try Setup("file", durableTimeoutMilliseconds: 2000)
        let (client, resume) = try setup.startThenLoseTheLog(of: "ivy")
        for user in ["ivy", "jon"] { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('while the log is away')", for: user, on: client) }
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "degraded" })
        #expect(setup.daemon.stop(within: .seconds(60)) == 0, "the daemon did not stop while the log could not be written")
        #expect(setup.daemon.stderr.contains("stopping with records the log did not store"))
        resume()
        try setup.daemon.start()
        let again = try setup.daemon.connect()
        for user in ["ivy", "jon"] { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('after')", for: user, on: again, durable: true) }
        try setup.loseTheHost()
        let restored = try setup.daemon.connect()
        #expect(try Self.titles("ivy", restored) == ["before", "while the log is away", "after"])
        #expect(try Self.titles("jon", restored) == ["while the log is away", "after"])
    }

    /// A delete while the log cannot be written is refused (`ReplicationUnavailable`) within
    /// the durable time-out — it waited a fixed 30 s before —, the local store kept and served;
    /// once the log is back the delete succeeds, and the log holds nothing of the user.
    @Test func aDeleteWhileTheLogCannotBeWrittenIsRefusedAndKeepsTheStore() throws {
        let setup = try Setup("file", durableTimeoutMilliseconds: 2000)
        let (client, resume) = try setup.startThenLoseTheLog(of: "kim")
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('during')", for: "kim", on: client)
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "degraded" })
        let asked = ContinuousClock.now
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "kim"])
        })
        let waited = ContinuousClock.now - asked
        #expect(waited < .seconds(20), "the refusal came after \(waited), against a 2 s durable time-out")
        #expect(try Self.titles("kim", client) == ["before", "during"])
        resume()
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "ok" && $0["log"]?["pendingBytes"] == 0 })
        _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "kim"])
        #expect(try setup.allRecords(of: "kim").isEmpty, "records of the deleted user are left in the log")
        #expect(try client.call("io.userstore.Store.Open", ["user": "kim"])["created"] == true)
    }

    /// A delete cut short half-way through erasing the user from the log (the stream removed,
    /// the tombstone not written: a file stands where its folder goes) is refused and keeps the
    /// local store, which ships whole with its next commit — its stream is gone from the log, so
    /// a record on top of it would restore nothing. After the disk is lost every write is back;
    /// the retry then erases the user.
    @Test func aDeleteCutShortInTheLogKeepsTheStoreWhole() throws {
        let setup = try Setup("file")
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        for title in ["one", "two"] {
            for user in ["lee", "max"] { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(title)')", for: user, on: client, durable: true) }
        }
        let tombstones = setup.replica.path + "/erased"
        try #require(FileManager.default.createFile(atPath: tombstones, contents: Data("in the way".utf8)))
        #expect(ReplicationTests.isError("io.userstore.Store.ReplicationUnavailable") {
            _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "lee"])
        })
        #expect(try setup.allRecords(of: "lee").count < 4, "the erase did not begin: nothing was cut short")
        #expect(try Self.titles("lee", client) == ["one", "two"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('three')", for: "lee", on: client, durable: true)
        unlink(tombstones)
        try setup.loseTheHost()
        let restored = try setup.daemon.connect()
        #expect(try Self.titles("lee", restored) == ["one", "two", "three"])
        #expect(try Self.titles("max", restored) == ["one", "two"])
        _ = try restored.call("io.userstore.Admin.DeleteStore", ["user": "lee"])
        #expect(try setup.allRecords(of: "lee").isEmpty, "records of the deleted user are left in the log")
        #expect(try restored.call("io.userstore.Store.Open", ["user": "lee"])["created"] == true)
    }
}

extension EncryptionTests {
    /// A delete the log refuses, with encryption: the user's data key is destroyed first (erase
    /// by key), so the refusal says so — not that nothing was deleted — and the store answers
    /// `StoreErased` from then on; once the log is back the retry completes the delete.
    @Test func aDeleteTheLogRefusesStillErasesByKeyAndSaysSo() throws {
        let replica = try TemporaryDirectory()
        let daemon = try DaemonHarness()
        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon)
            + "replication:\n  replica: \"file://\(replica.path)\"\n  durableTimeoutMilliseconds: 2000\n")
        try daemon.start()
        let client = try daemon.connect()
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "alice", on: client, durable: true)
        let resume = try ReplicationTests.stall(replica: replica.path)
        defer { resume() }
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('during')", for: "alice", on: client)
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "degraded" })
        let refused = varlinkError { _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "alice"]) }
        #expect(refused?.name == "io.userstore.Store.ReplicationUnavailable", "\(String(describing: refused))")
        #expect(refused?.parameters["message"]?.stringValue?.contains("its data key is destroyed already") == true, "\(String(describing: refused))")
        let erased = varlinkError { _ = try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT title FROM notes"]) }
        #expect(erased?.name == "io.userstore.Store.StoreErased", "\(String(describing: erased))")
        resume()
        #expect(try DurabilityTests.waitForReplication(client) { $0["state"] == "ok" && $0["log"]?["pendingBytes"] == 0 })
        _ = try client.call("io.userstore.Admin.DeleteStore", ["user": "alice"])
        #expect(try client.call("io.userstore.Store.Open", ["user": "alice"])["created"] == true)
        #expect(daemon.stop() == 0)
    }
}
