import DaemonTestSupport
import Foundation
import Synchronization
import Testing
import Varlink

/// What replication costs per user: no Litestream process but for a copy in its layout, read once.
@Suite(.serialized) struct ReplicaCostTests {
    /// A `litestream` that writes its subcommand to `log` and then runs the real one: which
    /// processes the daemon started.
    static func recordingLitestream(in directory: TemporaryDirectory) throws -> (binary: String, log: String) {
        let binary = directory.path + "/litestream", log = directory.path + "/subcommands"
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '\(log)'\nexec '\(litestreamPath)' \"$@\"\n"
            .write(toFile: binary, atomically: true, encoding: .utf8)
        chmod(binary, 0o755)
        return (binary, log)
    }

    static func subcommands(_ log: String) -> [String] {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// Litestream runs only to read a copy in its layout (from before the daemon's own log):
    /// new users and users the log holds cost no `litestream` process; a user whose copy is only
    /// in Litestream's layout costs one `litestream restore`, once.
    @Test func onlyACopyInLitestreamsLayoutCostsALitestreamProcess() throws {
        let replica = try TemporaryDirectory(), tools = try TemporaryDirectory()
        let (litestream, log) = try Self.recordingLitestream(in: tools)
        let config = "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestream)\n"
        let first = try DaemonHarness(extraConfig: config)
        try first.start()
        let client = try first.connect()
        for index in 0..<5 {
            #expect(try client.call("io.userstore.Store.Open", ["user": .string("new\(index)")])["created"] == true)
            try ReplicationTests.insert("kept", for: "new\(index)", on: client, durable: true)
        }
        #expect(Self.subcommands(log).isEmpty, "\(Self.subcommands(log))")
        _ = first.stop()
        try LitestreamCopies.write("old", titles: ["from litestream"], replica: "file://" + replica.path, folder: try LitestreamCopies.folder(of: "old"))

        // The host's disk is lost: the users come back from the log, old from its copy in
        // Litestream's layout — one restore — and ships a base to the log at that open.
        let second = try DaemonHarness(extraConfig: config)
        try second.start()
        let toSecond = try second.connect()
        #expect(try toSecond.call("io.userstore.Store.Query", ["user": "new3", "sql": "SELECT title FROM notes"])["rows"] == [["kept"]])
        #expect(try toSecond.call("io.userstore.Store.Query", ["user": "old", "sql": "SELECT title FROM notes"])["rows"] == [["from litestream"]])
        try ReplicationTests.insert("on the log", for: "old", on: toSecond, durable: true)
        #expect(Self.subcommands(log) == ["restore"])
        second.stop(signal: SIGKILL)

        // Lost again: old comes back from the log, with no Litestream.
        let third = try DaemonHarness(extraConfig: config)
        try third.start()
        #expect(try third.connect().call("io.userstore.Store.Query", ["user": "old", "sql": "SELECT title FROM notes ORDER BY id"])["rows"]
                == [["from litestream"], ["on the log"]])
        #expect(Self.subcommands(log) == ["restore"])
        _ = third.stop()
    }

    /// Bytes of every level-0 LTX file (what a sync ships; compactions write higher levels on
    /// their own schedule) in `user`'s folder of the `file://` replica at `replica`.
    static func shippedBytes(_ user: String, in replica: String) -> Int {
        let files = FileManager.default.enumerator(atPath: replica)?.compactMap { $0 as? String } ?? []
        return files.filter { $0.contains("/\(user)/") && $0.contains("/ltx/0/") && $0.hasSuffix(".ltx") }
            .compactMap { (try? FileManager.default.attributesOfItem(atPath: replica + "/" + $0)[.size]) as? Int }
            .reduce(0, +)
    }

}
