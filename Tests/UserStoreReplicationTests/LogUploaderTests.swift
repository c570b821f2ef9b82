import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import UserStoreConfiguration
import UserStoreCore
@testable import UserStoreReplication

/// The host log's uploader (``LogUploader``) on a real folder and a real S3 API (SeaweedFS): the
/// records of many writers go into few objects and come back whole and in order; a record counts
/// as stored only once its object and every earlier one are; a durable wait ends at its deadline
/// while the replica is away, and everything is stored once it is back.
@Suite(.serialized) struct LogUploaderTests {
    static func record(_ user: String, _ txid: UInt64) -> LogRecord {
        LogRecord(kind: .commit, user: user, bucket: nil, epoch: 1, stream: 1, txid: txid, pageSize: 4096, databasePages: 1,
                  pages: [WALCapture.Page(number: 1, data: [UInt8](repeating: UInt8(truncatingIfNeeded: txid), count: 4096))])
    }

    static func uploader(_ storage: ReplicaStorage, inFlight: Int = 2, batchMilliseconds: Int = 0) -> LogUploader {
        var settings = LogUploader.Settings()
        settings.maxInFlight = inFlight
        settings.batchMilliseconds = batchMilliseconds
        return LogUploader(storage: storage, origin: .init(host: "h", dataDirectory: "d", incarnation: "i", epoch: 1, folder: "log/e1/d/i/"),
                           settings: settings)
    }

    /// Every record of the objects under the log's folder, in the order of the objects.
    static func readBack(_ storage: ReplicaStorage) async throws -> (objects: Int, records: [LogRecord]) {
        let keys = try await storage.keys(under: "log/e1/d/i/")
        var records: [LogRecord] = []
        for key in keys { records += try LogSegment.decode(try #require(try await storage.get(key))).records }
        return (keys.count, records)
    }

    @Test(arguments: ["folder", "s3"]) func manyWritersRecordsGoTogetherAndComeBackInOrder(kind: String) async throws {
        let folder = try TemporaryDirectory()
        let server = kind == "s3" ? try SeaweedFS() : nil
        var settings = ReplicationSettings(replica: "file://" + folder.path)
        if let server {
            try server.createBucket("log")
            settings = try await ConfigurationKeyTestsSupport.s3Settings(server.replicaURL(bucket: "log", prefix: "p"))
        }
        let storage = try ReplicaStorage(settings, environment: server?.environment.merging(["PATH": "/usr/bin"]) { $1 } ?? [:])
        let uploader = Self.uploader(storage)
        let running = Task { await uploader.run() }
        defer { running.cancel() }
        // 16 writers, each appending a record and waiting until it is stored, 25 times.
        let users = (0..<16).map { "user\($0)" }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for user in users {
                group.addTask {
                    for txid in 1...25 {
                        let number = try #require(uploader.append(Self.record(user, UInt64(txid))))
                        #expect(await uploader.waitUntilStored(number, until: .now + .seconds(30)))
                    }
                }
            }
            try await group.waitForAll()
        }
        let (objects, records) = try await Self.readBack(storage)
        #expect(records.count == 400)
        for user in users {
            #expect(records.filter { $0.user == user }.map(\.txid) == Array(1...25), "\(user)'s records are missing or out of order")
        }
        // Group commit: records of several writers share objects.
        #expect(objects < 200, "\(objects) objects for 400 records")
        #expect(uploader.snapshot.stored == 400 && uploader.snapshot.objects == objects)
        print("log uploader (\(kind)): 16 writers, 400 durable records in \(objects) objects")
    }

    /// The first object cannot be written (a folder stands where its file goes): ann's next
    /// record waits for it — a store's records never go out in two objects at once, so a crash
    /// can never leave her later record in the replica without the earlier one — while bob's goes
    /// out in the next object and is stored at once (his durable write does not wait for hers).
    /// Once the first object is written, ann's second record follows in a third.
    @Test func aStoresRecordWaitsForItsEarlierObjectWhileOtherStoresGoOn() async throws {
        let folder = try TemporaryDirectory()
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + folder.path))
        let uploader = Self.uploader(storage, inFlight: 2)
        let blocker = folder.path + "/" + uploader.key(of: 1)
        try FileManager.default.createDirectory(atPath: blocker + "/in-the-way", withIntermediateDirectories: true)
        let running = Task { await uploader.run() }
        defer { running.cancel() }
        let annFirst = try #require(uploader.append(Self.record("ann", 1)))
        while uploader.snapshot.lastError == nil { try await Task.sleep(for: .milliseconds(10)) }
        let annSecond = try #require(uploader.append(Self.record("ann", 2)))
        let bob = try #require(uploader.append(Self.record("bob", 1)))
        #expect(await uploader.waitUntilStored(bob, until: .now + .seconds(30)), "bob's record waited for ann's object")
        #expect(!uploader.isStored(annFirst) && !uploader.isStored(annSecond) && uploader.stored == 0)
        #expect(!FileManager.default.fileExists(atPath: folder.path + "/" + uploader.key(of: 3)), "ann's second record went out while her first was not stored")
        #expect(await !uploader.flush(until: .now + .milliseconds(300)), "everything counted as stored before the first object was")
        try FileManager.default.removeItem(atPath: blocker)
        #expect(await uploader.waitUntilStored(annSecond, until: .now + .seconds(30)))
        #expect(uploader.stored == 3 && uploader.snapshot.stored == 3)
        let records = try await Self.readBack(storage).records
        #expect(records.map(\.user) == ["ann", "bob", "ann"] && records.filter { $0.user == "ann" }.map(\.txid) == [1, 2])
    }

    /// `batchMilliseconds`: while an object is being written (held back here by a folder in the
    /// way of its key), other stores' records wait for it rather than start objects of their
    /// own — and go together once it is stored (a day's batch time) or once the oldest of them
    /// has waited the batch time (300 ms), whichever comes first.
    @Test(arguments: [86_400_000, 300]) func recordsWaitForTheObjectInFlightUpToTheBatchTime(batchMilliseconds: Int) async throws {
        let folder = try TemporaryDirectory()
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + folder.path))
        let uploader = Self.uploader(storage, inFlight: 4, batchMilliseconds: batchMilliseconds)
        let blocker = folder.path + "/" + uploader.key(of: 1)
        try FileManager.default.createDirectory(atPath: blocker + "/in-the-way", withIntermediateDirectories: true)
        let running = Task { await uploader.run() }
        defer { running.cancel() }
        let first = try #require(uploader.append(Self.record("ann", 1)))
        while uploader.snapshot.lastError == nil { try await Task.sleep(for: .milliseconds(10)) }
        let others = try ["bob", "cy", "dan"].map { try #require(uploader.append(Self.record($0, 1))) }
        if batchMilliseconds > 1000 {
            // Held until the object in flight is stored (a slot was free for each of them).
            #expect(await !uploader.waitUntilStored(others[0], until: .now + .milliseconds(500)), "a record went out while an object was in flight")
            try FileManager.default.removeItem(atPath: blocker)
        } else {
            // The batch time passed: they go, together, while the first object still cannot.
            #expect(await uploader.waitUntilStored(others[2], until: .now + .seconds(10)))
            #expect(!uploader.isStored(first))
            try FileManager.default.removeItem(atPath: blocker)
        }
        #expect(await uploader.flush(until: .now + .seconds(30)))
        let (objects, records) = try await Self.readBack(storage)
        #expect(objects == 2, "\(objects) objects for a record in flight and three waiting")
        #expect(Set(records.map(\.user)) == ["ann", "bob", "cy", "dan"])
    }

    /// A wait that ended because its record was stored leaves nothing behind: its deadline's
    /// timer goes with it. (A timer left sleeping a day for every new store's base held the
    /// uploader, and ~1.5 KB each, for that day: here the uploader outlived its last reference.)
    @Test func aWaitThatEndsLeavesNoTimerBehind() async throws {
        let folder = try TemporaryDirectory()
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + folder.path))
        var uploader: LogUploader? = Self.uploader(storage)
        weak let gone = uploader
        let running = Task { [uploader] in await uploader!.run() }
        let number = try #require(uploader!.append(Self.record("ann", 1)))
        #expect(await uploader!.waitUntilStored(number, until: .now + .seconds(86_400)))
        running.cancel()
        await running.value
        uploader = nil
        // The cancelled timer finishes on the cooperative pool: at most 5 s for it.
        let deadline = ContinuousClock.now + .seconds(5)
        while gone != nil && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(gone == nil, "something still holds the uploader 5 s after its wait ended")
    }

    /// The loop stops whenever it is cancelled. A cancel that came after its look for work and
    /// before its wait began found no wait to end: the loop — and with it the daemon's stop —
    /// waited for the next append for ever (`aWaitThatEndsLeavesNoTimerBehind` hung once in
    /// `await running.value`). Each round cancels after a different number of yields; a loop
    /// still running 5 s after its cancel fails the test (an append then frees it).
    @Test func theLoopStopsWheneverItIsCancelled() async throws {
        let folder = try TemporaryDirectory()
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + folder.path))
        var hung = 0
        for round in 0..<3000 {
            let uploader = Self.uploader(storage)
            let stopped = Atomic(false)
            let running = Task {
                await uploader.run()
                stopped.store(true, ordering: .releasing)
            }
            for _ in 0..<(round % 8) { await Task.yield() }
            running.cancel()
            let deadline = ContinuousClock.now + .seconds(5)
            while !stopped.load(ordering: .acquiring), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
            if !stopped.load(ordering: .acquiring) {
                hung += 1
                _ = uploader.append(Self.record("ann", 1))
            }
            await running.value
        }
        #expect(hung == 0, "\(hung) of 3000 loops did not stop when cancelled")
    }

    /// The bucket cut off: durable waits end at their deadline, plain appends go on; once it is
    /// back, every record is stored, in order.
    @Test func waitsEndAtTheirDeadlineWhileTheBucketIsAwayAndAllIsStoredAfter() async throws {
        let server = try SeaweedFS()
        try server.createBucket("cut")
        let proxy = try CuttableProxy(to: server.port)
        let settings = try await ConfigurationKeyTestsSupport.s3Settings(server.replicaURL(bucket: "cut", prefix: "p", endpoint: "http://127.0.0.1:\(proxy.port)"),
                                                                          durableTimeoutMilliseconds: 1000)
        let storage = try ReplicaStorage(settings, environment: server.environment)
        let uploader = Self.uploader(storage)
        let running = Task { await uploader.run() }
        defer { running.cancel() }
        #expect(await uploader.waitUntilStored(try #require(uploader.append(Self.record("ann", 1))), until: .now + .seconds(30)))
        proxy.cut()
        let started = ContinuousClock.now
        let during = try #require(uploader.append(Self.record("ann", 2)))
        #expect(await !uploader.waitUntilStored(during, until: .now + .seconds(2)))
        let waited = ContinuousClock.now - started
        #expect(waited >= .seconds(2) && waited < .milliseconds(2200), "a wait for 2 s took \(waited)")
        for txid in 3...10 { #expect(uploader.append(Self.record("ann", UInt64(txid))) != nil) }
        proxy.mend()
        #expect(await uploader.waitUntilStored(uploader.appended, until: .now + .seconds(60)))
        #expect(try await Self.readBack(storage).records.map(\.txid) == Array(1...10))
    }
}

extension LogUploaderTests {
    /// A thread that waits for a record in a store's turn (the checkpoint's hold) is woken as
    /// soon as the record is stored, not at its deadline (past the test's time limit): the
    /// replica's folder is made only once the thread is on its way to wait, and the uploader's
    /// next try (100 ms or more after the last) stores the record.
    @Test(.timeLimit(.minutes(1))) func aThreadWaitingForARecordIsWokenWhenItIsStored() async throws {
        let parent = try TemporaryDirectory()
        let root = parent.path + "/replica"
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + root))
        let uploader = LogUploaderTests.uploader(storage)
        let running = Task { await uploader.run() }
        defer { running.cancel() }
        let number = try #require(uploader.append(LogUploaderTests.record("ann", 1)))
        #expect(await !uploader.waitUntilStored(number, until: .now + .milliseconds(200)), "stored with no replica folder")
        let stored = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            Thread { continuation.resume(returning: uploader.waitOnThisThread(for: number, until: .now + .seconds(90))) }.start()
            try? FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        }
        #expect(stored && uploader.isStored(number))
    }
}

/// Replication settings for an `s3://` replica URL, read the way the daemon reads them.
enum ConfigurationKeyTestsSupport {
    static func s3Settings(_ replica: String, durableTimeoutMilliseconds: Int = 10_000) async throws -> ReplicationSettings {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("settings-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("userstored.yaml").path
        try "appVersion: \"1.0.0\"\nreplication:\n  replica: \"\(replica)\"\n  durableTimeoutMilliseconds: \(durableTimeoutMilliseconds)\n"
            .write(toFile: file, atomically: true, encoding: .utf8)
        return try #require(try await ConfigurationLoader.load(path: file).replication)
    }
}
