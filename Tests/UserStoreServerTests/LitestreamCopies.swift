import DaemonTestSupport
import Foundation
import Testing
import UserStoreCore

/// Copies in Litestream's layout, as a deployment that replicated with Litestream (before the
/// daemon's own log) left them in its replica: a store made by a daemon without a replica,
/// shipped by the real `litestream replicate -once`.
enum LitestreamCopies {
    /// Makes `user`'s store with `titles` in `notes` and ships it with Litestream to the folder
    /// `folder` under the replica URL `replica` (`/ab/cd/ann/e1` — one host under the writer
    /// lease's epoch; `/ab/cd/ann` — before markers; `/<bucket>/ann/e<epoch>` — a cluster).
    static func write(_ user: String, titles: [String], replica: String, folder: String, environment: [String: String] = [:]) throws {
        let maker = try DaemonHarness()
        try maker.start()
        let client = try maker.connect()
        for title in titles { try DurabilityTests.execute("INSERT INTO notes (title) VALUES ('\(title)')", for: user, on: client) }
        #expect(maker.stop() == 0)
        // Without the host's AWS_CA_BUNDLE, which Litestream's S3 client refuses (the daemon
        // leaves it out too: ReplicaStorage.litestreamEnvironment).
        let shipped = try run(["/usr/bin/env", "-u", "AWS_CA_BUNDLE", litestreamPath, "replicate", "-once", "-force-snapshot", try DurabilityTests.storePath(user, maker), url(replica, folder)],
                              environment: environment)
        #expect(shipped.status == 0, "litestream replicate: \(shipped.stderr.suffix(2000))")
    }

    /// `user`'s folder in a one-host replica, as Litestream's layout had it.
    static func folder(of user: String, epoch: Int64? = 1) throws -> String {
        "/" + StoreLayout.hashPrefix(of: try UserID(user)) + "/" + user + (epoch.map { "/e\($0)" } ?? "")
    }

    /// The replica URL `replica` with `folder` added to its path (before any query).
    static func url(_ replica: String, _ folder: String) -> String {
        guard let query = replica.firstIndex(of: "?") else { return replica + folder }
        return String(replica[..<query]) + folder + String(replica[query...])
    }
}
