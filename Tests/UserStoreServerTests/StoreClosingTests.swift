import DaemonTestSupport
import Foundation
import Testing
import Varlink

extension LogEngineTests {
    /// A request for a store that is being closed waits for the close, then opens the store
    /// again: never a second connection beside the closing one. An evicted store's close waits
    /// for the log (stalled here) up to the durable time-out, longer than SQLite's busy time-out
    /// (5 s): a request for it meanwhile waited for the closing connection's lock and failed
    /// with `StorageFailure` ("database is locked").
    @Test func aRequestForAStoreBeingClosedWaitsForTheClose() throws {
        let setup = try Setup("file", extra: "maxOpenStores: 2", durableTimeoutMilliseconds: 8000)
        try setup.daemon.start()
        let client = try setup.daemon.connect()
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"])
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('before')", for: "fay", on: client, durable: true)
        let resume = try ReplicationTests.stall(replica: setup.replica.path)
        defer { resume() }
        try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('while the log is away')", for: "fay", on: client)
        _ = try client.call("io.userstore.Store.Open", ["user": "gil"]) // fay is the least recently used

        // Another client opens a third store: fay is evicted, and its close waits for the log.
        nonisolated(unsafe) let opener = try setup.daemon.connect() // used by that thread alone
        let opened = DispatchSemaphore(value: 0)
        Thread {
            _ = try? opener.call("io.userstore.Store.Open", ["user": "hal"])
            opened.signal()
        }.start()
        let takenOut = try ClusterDaemonTests.eventually {
            try client.call("io.userstore.Admin.Replication")["stores"]?.arrayValue?.contains(where: { $0["user"] == "fay" }) == false
        }
        guard takenOut else { Issue.record("fay's store was not taken out to be closed"); return }
        let reply = try client.call("io.userstore.Store.Query", ["user": "fay", "sql": "SELECT title FROM notes ORDER BY id"])
        #expect(reply["rows"] == [["before"], ["while the log is away"]], "\(reply)")
        #expect(opened.wait(timeout: .now() + 30) == .success)
    }
}
