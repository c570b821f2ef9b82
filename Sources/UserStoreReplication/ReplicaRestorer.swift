import Foundation
import UserStoreCore

/// Bringing a store back from the replica with `litestream restore`: on open when it is
/// missing here and for an operator's restore — only for a copy in Litestream's layout, from
/// before the daemon's own log (``LogReplicator``).
package struct ReplicaRestorer: Sendable {
    package let locations: ReplicaLocations
    package let command: LitestreamCommand
    /// `replication.durableTimeoutMilliseconds`: a restore may take six times that (30 s at least).
    package let durableTimeoutMilliseconds: Int

    /// Blocking work (Litestream's process, the files) runs on blocking-pool threads.
    package func restore(_ user: UserID, to path: String, timestamp: Date?) async throws -> ReplicaRestore? {
        let started = ContinuousClock.now
        var source: String
        do {
            // A new user costs one listing, not a `litestream restore` process (issue #38):
            // Litestream is asked only when the replica holds something of the user.
            guard let url = try await locations.restoreURL(for: user) else { return nil }
            source = url
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "looking for the user in the replica: \(error)")
        }
        var staged: String?
        if let timestamp {
            // A point in time may lie in an older epoch than the newest (before a take-over or a
            // bucket move, or in the layout before the writer lease): newest first.
            let candidates: [String]
            do {
                candidates = try await locations.restoreURLsAtAnyEpoch(for: user) ?? [source]
            } catch {
                throw StoreError.replicationUnavailable(user: user, message: "listing the user's epochs in the replica: \(error)")
            }
            for candidate in candidates where staged == nil {
                staged = try await BlockingPool.run { try restoreCopy(user, from: candidate, arguments: ["-timestamp", RFC3339.format(timestamp)], beside: path) }
                if staged != nil { source = candidate }
            }
            // Nothing at that time is an answer.
            guard staged != nil else { return nil }
        } else {
            staged = try await BlockingPool.run { [source] in try restoreCopy(user, from: source, arguments: ["-if-replica-exists"], beside: path) }
            // Nothing at all, where files of the user were just found, is not an answer: "found
            // nothing" never makes a returning user a new one.
            guard staged != nil else {
                throw StoreError.replicationUnavailable(user: user, message: "the replica holds files of the user at \(source), but litestream restore found no copy there; nothing was created")
            }
        }
        guard let staged else { return nil }
        let schemaVersion = try await BlockingPool.run { try Self.publish(staged, of: user, as: path) }
        return ReplicaRestore(source: source, schemaVersion: schemaVersion,
                              durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds)
    }

    /// Puts the restored copy `staged` in place as `path` and returns its schema version. Blocking.
    private static func publish(_ staged: String, of user: UserID, as path: String) throws -> Int64 {
        // On the staged copy, before it is put in place: a restored store never serves from
        // positions its watchers may already have been sent (ChangeLog).
        do throws(ChangeLogError) {
            try ChangeLog.continuePositionsAfterReplicaRestore(staged)
        } catch {
            removeStaged(staged)
            throw StoreError.storageFailure(user: user, message: "moving the restored copy's change log past the replica's positions: \(error.message)")
        }
        let schemaVersion = StoreFileInspector.schemaVersion(of: staged)
        do {
            // A WAL left beside a lost store file must not meet the restored one.
            try DurableFile.publishDatabase(staged, as: path)
        } catch {
            throw StoreError.storageFailure(user: user, message: "putting the restored copy in place: \(error)")
        }
        return schemaVersion
    }

    /// Removes a staged copy and whatever Litestream or SQLite left beside it.
    private static func removeStaged(_ staged: String) {
        for suffix in ["", "-wal", "-shm", "-txid", ".tmp"] { unlink(staged + suffix) }
    }

    /// Restores `source` (with Litestream's extra `arguments`) to a file beside `path` and
    /// returns it, integrity-checked; nil when the replica holds nothing (or nothing at that
    /// time). The caller moves or removes it. Litestream renames its output into place before its
    /// integrity check: the copy is staged, and only a clean exit leaves it.
    package func restoreCopy(_ user: UserID, from source: String, arguments: [String], beside path: String) throws -> String? {
        let staged = path + ".restoring"
        let cleanUp = { Self.removeStaged(staged) }
        cleanUp()
        let timed = arguments.contains("-timestamp")
        let result: (status: Int32, output: String)
        do {
            result = try command.run(["restore", "-o", staged, "-integrity-check", "quick"] + arguments + [source],
                                     limit: .milliseconds(max(30_000, durableTimeoutMilliseconds * 6)))
        } catch {
            cleanUp()
            throw StoreError.replicationUnavailable(user: user, message: "\(error)")
        }
        let restored = FileManager.default.fileExists(atPath: staged)
        if result.status != 0 || (timed && !restored) {
            cleanUp()
            let message = LitestreamCommand.lastLines(result.output)
            if timed, ["no matching backups", "no snapshots", "timestamp does not exist"].contains(where: message.contains) { return nil }
            // Nothing at all under the URL (a -txid restore of a copy that went elsewhere while
            // the replica had vanished): nothing there, not an outage.
            if message.contains("no matching backup files") { return nil }
            if LitestreamCommand.isDamage(message) { throw StoreError.replicaDamaged(user: user, message: message) }
            throw StoreError.replicationUnavailable(user: user, message: "litestream restore exited \(result.status): \(message)")
        }
        guard restored else { return nil }
        for suffix in ["-wal", "-shm", "-txid", ".tmp"] { unlink(staged + suffix) }
        return staged
    }
}
