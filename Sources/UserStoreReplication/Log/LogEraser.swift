import Crypto
import Foundation
import UserStoreCore

/// `DeleteStore` in the host log: nothing of the user is left in the bucket — every log object
/// holding its records is written again without them (or removed, when nothing else is left in
/// it), every folded object of the user is deleted — and a tombstone at the log's position then voids any record of the user written before
/// it that a restore might still meet (a fenced host's late upload). The tombstone names the user
/// by a hash, not by name (docs/design.md, "The host log").
package struct LogEraser: Sendable {
    package let storage: ReplicaStorage
    package let uploader: LogUploader
    /// The fold, which does not run meanwhile.
    package let folder: LogFolder?

    /// A tombstone: where the log stood when the user was erased.
    package struct Tombstone: Codable, Sendable, Equatable {
        package var epoch: Int64
        package var incarnation: String
        package var sequence: UInt64
        package var erasedAt: String
    }

    /// The tombstone's key for `user`.
    package static func tombstoneKey(of user: String) -> String {
        "erased/" + SHA256.hash(data: Data(user.utf8)).map { String(format: "%02x", $0) }.joined() + ".json"
    }

    /// Waits until every record appended so far is in an object — the user's last ones included
    /// (its store is closed) — before ``erase(_:epoch:)``; throws when the log has not stored
    /// them by `deadline`: nothing of the user is erased then.
    package func flush(until deadline: ContinuousClock.Instant) async throws {
        guard await uploader.flush(until: deadline) else {
            throw LogSegment.Damaged(description: "the log did not store what it holds in time (\(uploader.snapshot.lastError ?? "the replica is slow"))")
        }
    }

    /// Erases `user` from the log, once ``flush(until:)`` returned; in a cluster the tombstone
    /// stands at `epoch`, the user's bucket's. Throws when the replica cannot be written
    /// (nothing of the user may remain: retry).
    package func erase(_ user: String, epoch: Int64? = nil) async throws {
        let (storage, uploader) = (self.storage, self.uploader)
        let rewrite = { @Sendable () async throws in
            try await storage.delete(try await storage.keys(under: LogFolder.folder(of: user)))
            uploader.index?.setFolds(of: user, [])
            // The index, once listed, names the objects holding the user: only those are read.
            let keys: [String]
            if let indexed = uploader.index?.keys(of: user) { keys = indexed } else { keys = try await storage.keys(under: LogRestorer.folder) }
            for key in keys where key.hasSuffix(".usl") {
                guard let bytes = try await storage.get(key) else { continue }
                var segment = try LogSegment.decode(bytes)
                guard segment.header.users.contains(user) else { continue }
                segment.records.removeAll { $0.user == user }
                if segment.records.isEmpty {
                    try await storage.delete([key])
                } else {
                    try await storage.put(key, segment.encoded())
                }
                uploader.index?.replace(key, users: Set(segment.records.map(\.user)))
            }
        }
        if let folder { try await folder.gate.exclusive(rewrite) } else { try await rewrite() }
        let origin = uploader.origin
        let tombstone = Tombstone(epoch: epoch ?? uploader.epoch, incarnation: origin.incarnation, sequence: uploader.sequenceBegun,
                                  erasedAt: RFC3339.format(Date()))
        try await storage.put(Self.tombstoneKey(of: user), Array((try? JSONEncoder().encode(tombstone)) ?? Data()))
    }
}
