import Foundation
import GRDBSQLite
import UserStoreCore

/// Brings a user's store back from the host log: the newest base of the user, then the commits of
/// its stream in order (docs/design.md, "The host log").
///
/// Records are taken in log order — the writer lease's epoch, then the writing process's
/// incarnation, then the object's sequence, then the record's place in it. An erase ends
/// everything before it. Commits of one stream apply by txid; one whose changes start past what
/// was applied (`since` beyond it) means a record is missing: the copy is damaged, never restored
/// short.
package struct LogRestorer: Sendable {
    package let storage: ReplicaStorage
    /// Which objects hold which users (nil, or not yet listed: every object is read).
    package var index: LogIndex?

    package init(storage: ReplicaStorage, index: LogIndex? = nil) {
        self.storage = storage
        self.index = index
    }
    /// The folder of every log object (`log/`).
    package static let folder = "log/"

    /// What a restore brought back.
    package struct Restored: Sendable {
        package var stream: UInt64
        package var txid: UInt64
        package var epoch: Int64
        package var pageSize: Int
        package var databasePages: Int
    }

    /// A record of the user in log order.
    struct Ordered {
        let epoch: Int64
        let incarnation: String
        let sequence: UInt64
        let index: Int
        let createdAt: Date
        let record: LogRecord

        func precedes(_ other: Ordered) -> Bool {
            (epoch, incarnation, sequence, index) < (other.epoch, other.incarnation, other.sequence, other.index)
        }
    }

    /// Every record of `user` in the log, in log order (objects made after `until` left out).
    /// Reads every log object: the unfolded tail a restore needs. Blocking.
    func records(of user: String, until: Date? = nil) throws -> [Ordered] {
        var found: [Ordered] = []
        let tombstone = try storage.get(LogEraser.tombstoneKey(of: user)).flatMap { try? JSONDecoder().decode(LogEraser.Tombstone.self, from: Data($0)) }
        let listed = index?.keys(of: user)
        for key in try listed ?? storage.keys(under: Self.folder) where key.hasSuffix(".usl") {
            guard let bytes = try storage.get(key) else {
                // An object the index lists is gone: the log was emptied or moved, not "nothing there".
                if listed != nil { throw Unreadable(description: "\(storage.describe(key)), which holds records of \(user), is gone") }
                continue
            }
            let segment = try LogSegment.decode(bytes)
            guard segment.header.users.contains(user) else { continue }
            let createdAt = RFC3339.parse(segment.header.createdAt) ?? .distantPast
            if let until, createdAt > until { continue }
            for (index, record) in segment.records.enumerated() where record.user == user {
                // Erased: records written before the erase are void.
                if let tombstone, (record.epoch, segment.header.incarnation, segment.header.sequence) <= (tombstone.epoch, tombstone.incarnation, tombstone.sequence) {
                    continue
                }
                found.append(Ordered(epoch: record.epoch, incarnation: segment.header.incarnation, sequence: segment.header.sequence,
                                     index: index, createdAt: createdAt, record: record))
            }
        }
        return found.sorted { $0.precedes($1) }
    }

    /// The log cannot be read as the index says it is (an object gone): `ReplicationUnavailable`.
    package struct Unreadable: Error, CustomStringConvertible, Sendable {
        package let description: String
    }

    /// Whether the log holds anything of `user` that a restore would bring back. Blocking.
    package func holds(_ user: String) throws -> Bool {
        try reconstruction(of: try records(of: user)) != nil
    }

    /// Writes `user`'s store, as the log holds it (at `timestamp`: as of the last object made by
    /// then), to the new file `path`; nil when the log holds nothing of the user (or nothing
    /// then). Throws ``LogSegment/Damaged`` for a copy that cannot be whole. Blocking.
    package func restore(_ user: String, to path: String, timestamp: Date? = nil) throws -> Restored? {
        guard let (base, commits) = try reconstruction(of: try records(of: user, until: timestamp)) else { return nil }
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw LogSegment.Damaged(description: "cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var current = base.txid
        var last = base
        try Self.apply(base, to: descriptor)
        for record in commits where record.txid > current {
            guard record.since <= current else {
                throw LogSegment.Damaged(description: "the log of \(user) has no record from txid \(current) to \(record.since) of stream \(base.stream) (a log object is missing)")
            }
            try Self.apply(record, to: descriptor)
            current = record.txid
            last = record
        }
        guard fsync(descriptor) == 0 else { throw LogSegment.Damaged(description: "cannot sync \(path): \(String(cString: strerror(errno)))") }
        return Restored(stream: base.stream, txid: current, epoch: last.epoch, pageSize: Int(last.pageSize), databasePages: Int(last.databasePages))
    }

    /// The newest base of the records (after any erase) and the commits of its stream after it
    /// by txid; nil when there is none.
    private func reconstruction(of records: [Ordered]) throws -> (base: LogRecord, commits: [LogRecord])? {
        let afterErase = records.lastIndex { $0.record.kind == .erase }.map { Array(records[(records.index(after: $0))...]) } ?? records
        guard let baseIndex = afterErase.lastIndex(where: { $0.record.kind == .base }) else {
            if afterErase.contains(where: { $0.record.kind == .commit }) {
                throw LogSegment.Damaged(description: "the log holds commits of \(records.first?.record.user ?? "the user") but no base they start from")
            }
            return nil
        }
        let base = afterErase[baseIndex].record
        let commits = afterErase[baseIndex...].map(\.record).filter { $0.kind == .commit && $0.stream == base.stream }
            .sorted { $0.txid < $1.txid }
        return (base, commits)
    }

    private static func apply(_ record: LogRecord, to descriptor: Int32) throws {
        let size = Int(record.pageSize)
        for page in record.pages {
            let written = page.data.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, size, off_t(Int(page.number - 1) * size)) }
            guard written == size else { throw LogSegment.Damaged(description: "writing a restored page: \(String(cString: strerror(errno)))") }
        }
        guard ftruncate(descriptor, off_t(Int(record.databasePages) * size)) == 0 else {
            throw LogSegment.Damaged(description: "sizing a restored file: \(String(cString: strerror(errno)))")
        }
    }
}
