import Crypto
import Foundation
import Synchronization
import UserStoreCore

/// Folds the host log into per-user objects: the oldest log objects, once older than
/// `replication.foldSeconds`, are read, each user's records in them go into one object of that
/// user (`users/<hh>/<user>/<position>-d.usl`, a *delta*: consecutive commits merged, each page
/// once), and the log objects are deleted. After eight deltas, or when the records hold a new
/// base, the user's records are folded into a *snapshot* instead (`…-b.usl`: the whole store as
/// of the position) and the user's older folded objects deleted. A restore reads the user's
/// newest snapshot, the deltas after it and the log objects after those: what a restore reads
/// stays small however long the log runs, and the log holds only its unfolded tail
/// (docs/design.md, "The host log").
///
/// A folded object is named after the last log object it holds (``LogObjectPosition/name``);
/// log objects at or before the newest folded object's position are not read again, so the
/// short time between writing a fold and deleting the log objects it holds is never counted twice.
package final class LogFolder: Sendable {
    package let storage: ReplicaStorage
    package let index: LogIndex
    package let uploader: LogUploader
    /// Written while a fold or an erase deletes or rewrites objects, read while a restore reads
    /// them: a restore never meets an object deleted halfway through its reading.
    package let gate: AsyncLock
    /// Deltas after a snapshot past which the next fold of the user writes a snapshot.
    package static let maxDeltas = 8

    package init(storage: ReplicaStorage, index: LogIndex, uploader: LogUploader, gate: AsyncLock = AsyncLock()) {
        self.storage = storage
        self.index = index
        self.uploader = uploader
        self.gate = gate
    }

    /// The folder of `user`'s folded objects: `users/<first byte of SHA-256(user), hex>/<user>/`
    /// (the hash spreads users over S3's key partitions).
    package static func folder(of user: String) -> String {
        "users/" + String(format: "%02x", SHA256.hash(data: Data(user.utf8)).first { _ in true } ?? 0) + "/" + user + "/"
    }

    /// The folder of every user's folded objects.
    package static let root = "users/"

    /// The user whose folded object `key` is; nil when `key` is not one.
    package static func user(ofFold key: String) -> String? {
        let parts = key.split(separator: "/")
        guard parts.count == 4, parts[0] == "users", key.hasSuffix(".usl"), position(ofFold: key) != nil else { return nil }
        return String(parts[2])
    }

    /// The position of the last log object the folded object `key` holds.
    package static func position(ofFold key: String) -> LogObjectPosition? {
        guard let name = key.split(separator: "/").last, name.hasSuffix(".usl") else { return nil }
        let stem = name.dropLast(4)
        guard stem.hasSuffix("-b") || stem.hasSuffix("-d") else { return nil }
        return LogObjectPosition(name: stem.dropLast(2))
    }

    /// Whether the folded object `key` is a snapshot (holds a base).
    package static func isSnapshot(_ key: String) -> Bool { key.hasSuffix("-b.usl") }

    /// What one fold did.
    package struct Report: Sendable, Equatable {
        package var logObjects = 0
        package var users = 0
        package var snapshots = 0
        package var bytesWritten = 0
    }

    /// Folds the oldest log objects made before `cutoff` (at most `maxObjects` of them: a bounded
    /// amount of memory): each user's records into that user's objects, then deletes them. The
    /// objects taken are a prefix of the log — the first one too young (or of this process and
    /// not yet stored with every one before it) ends it. Nil when there was nothing to fold.
    /// Throws when the replica fails (the next round tries again: nothing is deleted before the
    /// folds holding it are stored).
    package func fold(before cutoff: Date, maxObjects: Int = 64, cluster: ClusterView? = nil) async throws -> Report? {
        try await gate.exclusive { try await foldAlone(before: cutoff, maxObjects: maxObjects, cluster: cluster) }
    }

    /// In a cluster, what the fold needs to know: each host folds only its own data directory's
    /// objects, and of those only the records that count — of a bucket this host owned, by etcd
    /// read after they were stored, at the record's epoch, or judged by a fence of the bucket's
    /// later owner. A record of a bucket that moved and is not fenced yet stops the fold there
    /// until the new owner's fence is in.
    package struct ClusterView: Sendable {
        /// The buckets this host owns, at their epochs, read from etcd after `storedThrough`.
        package var owned: [UInt16: Int64]
        /// The last sequence of this process's objects stored before `owned` was read.
        package var storedThrough: UInt64

        package init(owned: [UInt16: Int64], storedThrough: UInt64) {
            self.owned = owned
            self.storedThrough = storedThrough
        }
    }

    /// Whether this host's data directory has log objects made before `cutoff` to fold.
    package func hasWork(before cutoff: Date) -> Bool {
        let ownDirectory = LogRestorer.folder + uploader.origin.dataDirectory + "/"
        return index.entries.contains { $0.key.hasPrefix(ownDirectory) && $0.entry.createdAt < cutoff }
    }

    private func foldAlone(before cutoff: Date, maxObjects: Int, cluster: ClusterView?) async throws -> Report? {
        guard index.isLoaded else { return nil }
        // Objects the fences void: nothing reads them.
        let void = index.takeVoid()
        if !void.isEmpty { try await storage.delete(void) }
        let own = uploader.origin
        let storedSequence = cluster?.storedThrough ?? uploader.storedSequence
        let ownDirectory = LogRestorer.folder + own.dataDirectory + "/"
        var batch: [(key: String, entry: LogIndex.Entry)] = []
        for (key, entry) in index.entries {
            if cluster != nil, !key.hasPrefix(ownDirectory) { continue }
            guard batch.count < maxObjects, entry.createdAt < cutoff else { break }
            if key.hasPrefix(own.folder), entry.position.sequence > storedSequence { break }
            batch.append((key, entry))
        }
        guard var through = batch.last?.entry.position else { return nil }
        // Each user's records, in log order.
        var recordsOf: [String: [LogRecord]] = [:]
        /// In a cluster, each user's folded object is named after the last record of it folded.
        var throughOf: [String: LogObjectPosition] = [:]
        var newest = Date.distantPast
        // Read and written `width` requests at a time: one after another, the fold fell behind
        // a log uploading 190 objects a second (66,000 objects unfolded after 110,000 touches).
        let storage = self.storage
        let segments = Mutex<[String: LogSegment]>([:])
        try await batch.map(\.key).concurrentForEach(width: Self.width) { key in
            guard let bytes = try await storage.get(key) else {
                throw LogRestorer.Unreadable(description: "\(storage.describe(key)), listed in the log, is gone")
            }
            let segment = try LogSegment.decode(bytes)
            segments.withLock { $0[key] = segment }
        }
        let read = segments.withLock { $0 }
        var fences = LogFences()
        if cluster != nil {
            fences = try await LogFences.load(from: storage, known: index.knownFences)
            index.setFences(fences)
        }
        let fencedEpochs = fences.bucketEpochs
        var taken = 0
        objects: for (key, _) in batch {
            guard let segment = read[key] else { continue }
            var kept: [LogRecord] = []
            for record in segment.records {
                if let cluster, let bucket = record.bucket, cluster.owned[bucket] != record.epoch {
                    // A bucket that moved: only its new owner's fence tells whether this counts.
                    guard let fenced = fencedEpochs[bucket], fenced > record.epoch else { break objects }
                    guard fences.counts(key, header: segment.header, record: record) else { continue }
                }
                kept.append(record)
            }
            // Only an object taken whole moves its users' positions (one left for a later round
            // must not name a fold past what the fold holds).
            if cluster != nil {
                for record in kept {
                    let position = LogObjectPosition(segment.header, record)
                    throughOf[record.user] = max(throughOf[record.user] ?? position, position)
                }
            }
            taken += 1
            newest = max(newest, RFC3339.parse(segment.header.createdAt) ?? .distantPast)
            for record in kept { recordsOf[record.user, default: []].append(record) }
        }
        batch = Array(batch.prefix(taken))
        guard let last = batch.last else { return nil }
        through = last.entry.position
        let report = Mutex(Report(logObjects: batch.count, users: recordsOf.count))
        try await Array(recordsOf).concurrentForEach(width: Self.width) { [newest, through, throughOf] user, records in
            let written = try await self.fold(records, of: user, through: throughOf[user] ?? through, createdAt: newest)
            report.withLock { report in
                report.bytesWritten += written.bytes
                if written.snapshot { report.snapshots += 1 }
            }
        }
        try await storage.delete(batch.map(\.key))
        for (key, _) in batch { index.replace(key, users: []) }
        return report.withLock { $0 }
    }

    /// Requests to the replica a fold makes at once.
    static let width = 8

    /// Writes one folded object of `user` with `records` (read from the log up to `through`),
    /// a snapshot when due, and deletes what a snapshot supersedes.
    private func fold(_ records: [LogRecord], of user: String, through: LogObjectPosition, createdAt: Date) async throws -> (bytes: Int, snapshot: Bool) {
        // Only folds before this one (in a cluster, a later owner may have folded the user since).
        let listed = index.folds(of: user) ?? []
        let existing = listed.filter { Self.position(ofFold: $0).map { $0 < through } ?? false }
        let later = Set(listed).subtracting(existing)
        let lastSnapshot = existing.lastIndex(where: Self.isSnapshot)
        let deltas = existing.count - (lastSnapshot.map { $0 + 1 } ?? 0)
        var folded = Self.merged(records)
        var snapshot = false
        if records.contains(where: { $0.kind == .base }) || deltas >= Self.maxDeltas {
            var all = records
            if !records.contains(where: { $0.kind == .base }), let lastSnapshot {
                all = []
                for key in existing[lastSnapshot...] {
                    guard let bytes = try await storage.get(key) else { throw LogRestorer.Unreadable(description: "\(storage.describe(key)) is gone") }
                    all += try LogSegment.decode(bytes).records
                }
                all += records
            }
            // A gap (records of a crashed process never stored) cannot be a snapshot: a delta keeps them.
            if let whole = try? Self.snapshot(of: all) {
                folded = [whole]
                snapshot = true
            }
        }
        let key = Self.folder(of: user) + through.name + (snapshot ? "-b" : "-d") + ".usl"
        let segment = LogSegment(header: .init(kind: "fold", host: uploader.origin.host, dataDirectory: uploader.origin.dataDirectory,
                                               incarnation: through.incarnation, epoch: through.epoch, sequence: through.sequence,
                                               createdAt: RFC3339.format(createdAt), records: 0, users: [], bodyBytes: 0, recordBytes: 0),
                                 records: folded)
        let bytes = segment.encoded()
        try await storage.put(key, bytes)
        var kept = Set(existing).union(later)
        kept.insert(key)
        if snapshot {
            let superseded = existing.filter { $0 != key }
            try await storage.delete(superseded)
            kept.subtract(superseded)
        }
        index.setFolds(of: user, kept)
        return (bytes.count, snapshot)
    }

    /// `records` with each run of consecutive commits of one stream merged into one record
    /// (`since` of the first to `txid` of the last, each page once, as the last wrote it).
    package static func merged(_ records: [LogRecord]) -> [LogRecord] {
        var out: [LogRecord] = []
        for record in records {
            guard record.kind == .commit, var last = out.last, last.kind == .commit, last.stream == record.stream,
                  record.since == last.txid, record.pageSize == last.pageSize else {
                out.append(record)
                continue
            }
            var pages = Dictionary(last.pages.map { ($0.number, $0) }, uniquingKeysWith: { $1 })
            for page in record.pages { pages[page.number] = page }
            last.pages = pages.values.filter { $0.number <= record.databasePages }.sorted { $0.number < $1.number }
            last.txid = record.txid
            last.epoch = record.epoch
            last.databasePages = record.databasePages
            out[out.count - 1] = last
        }
        return out
    }

    /// The store `records` (in log order) rebuild, as one base at the last position; nil when
    /// they hold no base (after an erase). Throws ``LogSegment/Damaged`` for a gap.
    package static func snapshot(of records: [LogRecord]) throws -> LogRecord? {
        guard let (base, commits) = try LogRestorer.reconstruction(of: records) else { return nil }
        var pages = Dictionary(base.pages.map { ($0.number, $0) }, uniquingKeysWith: { $1 })
        var current = base.txid
        var last = base
        for record in try LogRestorer.chain(commits, from: current, user: base.user, stream: base.stream) {
            guard record.pageSize == base.pageSize else {
                throw LogSegment.Damaged(description: "the records of \(base.user) change the page size from \(base.pageSize) to \(record.pageSize)")
            }
            for page in record.pages { pages[page.number] = page }
            current = record.txid
            last = record
        }
        return LogRecord(kind: .base, user: base.user, bucket: last.bucket, epoch: last.epoch, stream: base.stream, txid: current, since: current,
                         pageSize: base.pageSize, databasePages: last.databasePages,
                         pages: pages.values.filter { $0.number <= last.databasePages }.sorted { $0.number < $1.number })
    }
}
