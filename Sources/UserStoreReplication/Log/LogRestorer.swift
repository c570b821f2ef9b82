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
    /// Read while the user's objects are read: the fold and the erase wait (``LogFolder/gate``).
    package var gate: AsyncLock?
    /// In a cluster other hosts fold and delete objects this host's index lists: a user's folded
    /// objects are listed at each restore, and a log object gone since the listing is dropped
    /// from the index and the reading starts over (its records are in a fold by then).
    package var cluster: Bool
    /// The data keys of encrypted stores, whose rebuilt file is checked with the user's key
    /// (nil: encryption is off, and an encrypted copy is ``StoreError/storeKeyMissing(user:message:)``).
    package var keyring: StoreKeyring?

    package init(storage: ReplicaStorage, index: LogIndex? = nil, gate: AsyncLock? = nil, cluster: Bool = false, keyring: StoreKeyring? = nil) {
        self.storage = storage
        self.index = index
        self.gate = gate
        self.cluster = cluster
        self.keyring = keyring
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

    /// Every record of `user` in the log, in log order (objects made after `until` left out):
    /// its newest snapshot and the deltas after it (``LogFolder``), then the log objects after
    /// those. An object listed but gone by the time it is read (folded meanwhile) starts the
    /// reading over, up to three times.
    func records(of user: String, until: Date? = nil) async throws -> [Ordered] {
        var attempt = 0
        while true {
            do {
                if let gate { return try await gate.shared { try await readRecords(of: user, until: until) } }
                return try await readRecords(of: user, until: until)
            } catch let gone as Gone {
                attempt += 1
                if cluster, let index, gone.logObject { index.replace(gone.key, users: []) }
                if attempt >= (cluster ? 10 : 3) { throw Unreadable(description: gone.description) }
            }
        }
    }

    /// An object listed a moment ago and gone now.
    private struct Gone: Error, CustomStringConvertible {
        let key: String
        let description: String
        /// A log object (not a folded one).
        var logObject = false
    }

    private func readRecords(of user: String, until: Date?) async throws -> [Ordered] {
        var found: [Ordered] = []
        let tombstone = try await storage.get(LogEraser.tombstoneKey(of: user)).flatMap { try? JSONDecoder().decode(LogEraser.Tombstone.self, from: Data($0)) }
        // The log first, then the folds: a fold is written before the log objects it holds are
        // deleted, so whatever the first listing saw and the second did not is read from a fold.
        let logKeys: [String]
        if let indexed = index?.keys(of: user) { logKeys = indexed } else { logKeys = try await storage.keys(under: Self.folder).filter { $0.hasSuffix(".usl") } }
        // What an old holder uploaded after a new one fenced the log never counts.
        let fences: LogFences
        if let listed = index?.fences { fences = listed } else { fences = try await LogFences.load(from: storage, known: index?.knownFences ?? LogFences()) }
        let foldKeys: [String]
        if !cluster, let indexed = index?.folds(of: user) {
            foldKeys = indexed
        } else {
            foldKeys = try await storage.keys(under: LogFolder.folder(of: user)).filter { LogFolder.position(ofFold: $0) != nil }
        }
        // The newest snapshot (the newest made by `until`) and the deltas after it.
        var through: LogObjectPosition?
        var folds: [(key: String, segment: LogSegment)] = []
        for key in foldKeys.reversed() {
            // A fold at or before an erase (another host's, written as the erase ran) is void.
            if let tombstone, let position = LogFolder.position(ofFold: key),
               (position.epoch, position.incarnation, position.sequence) <= (tombstone.epoch, tombstone.incarnation, tombstone.sequence) {
                continue
            }
            guard let bytes = try await storage.get(key) else { throw Gone(key: key, description: "\(storage.describe(key)), which holds records of \(user), is gone") }
            let segment = try LogSegment.decode(bytes)
            if let until, (RFC3339.parse(segment.header.createdAt) ?? .distantPast) > until { continue }
            folds.insert((key, segment), at: 0)
            if through == nil { through = LogFolder.position(ofFold: key) }
            if LogFolder.isSnapshot(key) { break }
        }
        for (key, segment) in folds {
            for (index, record) in segment.records.enumerated() where record.user == user {
                found.append(Ordered(epoch: .min, incarnation: key, sequence: 0, index: index, createdAt: .distantPast, record: record))
            }
        }
        for key in logKeys {
            guard let bytes = try await storage.get(key) else {
                throw Gone(key: key, description: "\(storage.describe(key)), which holds records of \(user), is gone", logObject: true)
            }
            // Unindexed (the listing is not in yet), every object is read: one that does not
            // name the user is skipped by its header, so damage elsewhere never refuses this user.
            guard let read = try LogSegment.header(of: bytes) else { throw LogSegment.Damaged(description: "\(storage.describe(key)) is truncated within its header") }
            guard read.header.users.contains(user) else { continue }
            let segment = try LogSegment.decode(bytes, header: read)
            let createdAt = RFC3339.parse(segment.header.createdAt) ?? .distantPast
            if let until, createdAt > until { continue }
            for (index, record) in segment.records.enumerated() where record.user == user {
                // What an old owner uploaded after the fence, and what a fold already holds, is left.
                guard fences.counts(key, header: segment.header, record: record) else { continue }
                if let through, LogObjectPosition(segment.header, record) <= through { continue }
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

    /// Whether the log holds anything of `user` that a restore would bring back.
    package func holds(_ user: String) async throws -> Bool {
        try Self.reconstruction(of: try await records(of: user).map(\.record)) != nil
    }

    /// Writes `user`'s store, as the log holds it (at `timestamp`: as of the last object made by
    /// then), to the new file `path`; nil when the log holds nothing of the user (or nothing
    /// then). Throws ``LogSegment/Damaged`` for a copy that cannot be whole or fails SQLite's
    /// `quick_check`. The file is written on a blocking-pool thread.
    package func restore(_ user: String, to path: String, timestamp: Date? = nil) async throws -> Restored? {
        guard let (base, commits) = try Self.reconstruction(of: try await records(of: user, until: timestamp).map(\.record)) else { return nil }
        let restored = try await BlockingPool.run { try Self.write(base, commits, of: user, to: path) }
        // An encrypted store's pages come back as they were shipped, encrypted: checked with
        // the user's key (StoreKeyMissing, StoreErased when there is none).
        let cipher = try await StoreKeyring.cipher(ifEncrypted: path, user: try UserID(user), keyring: keyring)
        if let problem = await BlockingPool.run({ StoreFileInspector.quickCheck(path, cipher: cipher) }) {
            throw LogSegment.Damaged(description: "the store rebuilt from the log fails its integrity check: \(problem)")
        }
        return restored
    }

    /// Writes the store `base` and `commits` rebuild to the new file `path`. Blocking.
    private static func write(_ base: LogRecord, _ commits: [LogRecord], of user: String, to path: String) throws -> Restored {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw LogSegment.Damaged(description: "cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var current = base.txid
        var last = base
        try apply(base, to: descriptor)
        for record in try chain(commits, from: current, user: user, stream: base.stream) {
            try apply(record, to: descriptor)
            current = record.txid
            last = record
        }
        guard fsync(descriptor) == 0 else { throw LogSegment.Damaged(description: "cannot sync \(path): \(String(cString: strerror(errno)))") }
        return Restored(stream: base.stream, txid: current, epoch: last.epoch, pageSize: Int(last.pageSize), databasePages: Int(last.databasePages))
    }

    /// The records to apply, in order, to the state at `start` to reach the newest state
    /// `commits` hold: at each step the one that reaches furthest among those that start at or
    /// before where the state is (a record from `since` to `txid` brings any state between the
    /// two to `txid`). A record a crash left behind — its process killed after a later object was
    /// stored but before this one was, its commits then sent again as one record from an older
    /// position — is covered that way instead of read as a gap. Throws
    /// ``LogSegment/Damaged`` when what is left starts past where the state got: a missing object.
    static func chain(_ commits: [LogRecord], from start: UInt64, user: String, stream: UInt64) throws -> [LogRecord] {
        let bySince = commits.sorted { ($0.since, $0.txid) < ($1.since, $1.txid) }
        var current = start, next = 0
        var chosen: [LogRecord] = []
        while true {
            var best: LogRecord?
            while next < bySince.count, bySince[next].since <= current {
                if bySince[next].txid > (best?.txid ?? current) { best = bySince[next] }
                next += 1
            }
            guard let best else { break }
            chosen.append(best)
            current = best.txid
        }
        if let beyond = bySince[next...].first(where: { $0.txid > current }) {
            throw LogSegment.Damaged(description: "the log of \(user) has no record from txid \(current) to \(beyond.since) of stream \(stream) (a log object is missing)")
        }
        return chosen
    }

    /// The newest base of `records` (in log order; after any erase) and the commits of its
    /// stream after it by txid; nil when there is none.
    static func reconstruction(of records: [LogRecord]) throws -> (base: LogRecord, commits: [LogRecord])? {
        let afterErase = records.lastIndex { $0.kind == .erase }.map { Array(records[(records.index(after: $0))...]) } ?? records
        guard let baseIndex = afterErase.lastIndex(where: { $0.kind == .base }) else {
            if afterErase.contains(where: { $0.kind == .commit }) {
                throw LogSegment.Damaged(description: "the log holds commits of \(records.first?.user ?? "the user") but no base they start from")
            }
            return nil
        }
        let base = afterErase[baseIndex]
        let commits = afterErase[baseIndex...].filter { $0.kind == .commit && $0.stream == base.stream }.sorted { $0.txid < $1.txid }
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
