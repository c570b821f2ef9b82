import DaemonTestSupport
import Foundation
import Testing
import Varlink

extension LogEngineTests {
    /// A request for a store that is being closed waits for the close, then opens the store
    /// again: never a second connection beside the closing one. An evicted store's close waits
    /// for the log — a bucket answering 8 s late here — longer than SQLite's busy time-out
    /// (5 s): a request for it meanwhile waited for the closing connection's lock and failed
    /// with `StorageFailure` ("database is locked").
    @Test func aRequestForAStoreBeingClosedWaitsForTheClose() throws {
        let setup = try Setup("s3", extra: "maxOpenStores: 2", durableTimeoutMilliseconds: 10000, proxied: true)
        let (proxy, daemon) = (setup.proxy!, setup.daemon)
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "fay", on: client, durable: true)
        // Slow, not failing: a close waits for a log that is being written (one that cannot be
        // written is not waited for at all).
        proxy.slow(milliseconds: 8000)
        defer { proxy.normal() }
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('while the log is slow')", for: "fay", on: client)
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"]) // fay is the least recently used

        // Another client opens a third store: fay is evicted, and its close waits for the log.
        nonisolated(unsafe) let opener = try daemon.connect() // used by that thread alone
        let opened = DispatchSemaphore(value: 0)
        Thread {
            _ = try? opener.call("io.userstore.Store.Open", ["user": "hal"])
            opened.signal()
        }.start()
        let takenOut = try ClusterDaemonTests.eventually {
            try client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue?.contains(where: { $0["user"] == "fay" }) == false
        }
        guard takenOut else { Issue.record("fay's store was not taken out to be closed"); return }
        let asked = ContinuousClock.now
        let reply = try client.call("io.userstore.Store.Query", ["user": "fay", "sql": "SELECT title FROM notes ORDER BY id"])
        #expect(reply["rows"] == [["before"], ["while the log is slow"]], "\(reply)")
        // What this test is about: the close outlasted SQLite's busy time-out.
        #expect(ContinuousClock.now - asked > .seconds(5), "the close was over before SQLite's busy time-out: nothing was shown")
        #expect(opened.wait(timeout: .now() + 30) == .success)
    }
}
