import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// A watched store brought back from a replica that lacks its last transactions (the host lost
/// while the log could not be written): the positions watchers were sent past the replica's are never
/// given to other transactions — a watcher resuming from one is told to re-read, and one that
/// was behind the replica gets what it kept first.
@Suite(.serialized) struct WatchRestoreTests {
    let watches = WatchTests()

    /// Encrypted too (docs/encryption.md): the restored copy's change log is moved with the
    /// user's key.
    @Test(.timeLimit(.minutes(5)), arguments: [false, true])
    func aWatcherResumingPastWhatTheReplicaHadIsToldToReRead(encrypted: Bool) throws {
        let keys = try TemporaryDirectory()
        if encrypted {
            try FileManager.default.createDirectory(atPath: keys.path + "/store", withIntermediateDirectories: true)
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString().write(toFile: keys.path + "/kek", atomically: true, encoding: .utf8)
        }
        let encryption = encrypted ? "encryption:\n  keyFile: \(keys.path)/kek\n  keyStore: file://\(keys.path)/store\n" : ""
        let (replica, daemon, client) = try DurabilityTests.started(extra: WatchTests.watchOn + encryption)
        defer { daemon.stop() }
        // Recording on from a first watch; then three transactions, the last durable: all three
        // are in the replica.
        let first = try daemon.connect()
        let start = try watches.watch(first, user: "ann")
        first.hangUp()
        for index in 0..<3 { try ReplicationTests.insert("replicated \(index)", for: "ann", on: client, durable: index == 2) }
        // Five more the replica never gets, each sent to a watcher: a file where the log's
        // folder was, so no object can be written.
        let resume = try ReplicationTests.stall(replica: replica.path)
        let watcher = try daemon.connect()
        let before = try watches.watch(watcher, user: "ann")
        #expect(before == start + 3)
        for index in 0..<5 { try ReplicationTests.insert("lost \(index)", for: "ann", on: client) }
        var seen = before
        for _ in 0..<5 { seen = try #require(try watches.next(watcher)["position"]?.integerValue) }
        #expect(seen == before + 5)

        // The host is lost (the log's folder back for the next one); the next one restores the
        // store from the replica, and six new transactions follow — as many as it takes to pass
        // the positions the watcher was sent.
        daemon.stop(signal: SIGKILL)
        resume()
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        #expect(try daemon.connect().call("io.userstore.Store.Open", ["user": "ann"])["created"] == false)
        let restored = try LogEngineTests.titles("ann", try daemon.connect())
        #expect(restored.contains("replicated 2") && !restored.contains("lost 0"), "\(restored)")
        let writer = try daemon.connect()
        for index in 0..<6 { try ReplicationTests.insert("new \(index)", for: "ann", on: writer) }

        // Resuming from the last position it was sent: a reset (re-read), then the new six.
        let resumed = try daemon.connect()
        let position = try watches.watch(resumed, user: "ann", since: seen)
        let reset = try watches.next(resumed)
        #expect(reset["reset"]?.boolValue == true, "the watcher resumed past the restored store's last position without a reset: \(reset)")
        let resetAt = try #require(reset["position"]?.integerValue)
        #expect(resetAt > seen)
        for offset in 1...6 { #expect(try watches.next(resumed)["position"]?.integerValue == resetAt + Int64(offset)) }
        #expect(position == resetAt + 6)

        // A watcher that was behind the replica gets the three it kept, then the reset.
        let behind = try daemon.connect()
        _ = try watches.watch(behind, user: "ann", since: start)
        for offset in 1...3 { #expect(try watches.next(behind)["position"]?.integerValue == start + Int64(offset)) }
        #expect(try watches.next(behind)["position"]?.integerValue == resetAt)
    }
}
