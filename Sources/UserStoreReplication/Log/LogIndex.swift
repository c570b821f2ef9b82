import Foundation
import Synchronization
import UserStoreCore

/// Which log objects hold which users, and which folded objects each user has: read once when
/// the daemon starts holding the replica (a listing of `log/` and `users/`, and a ranged read of
/// each log object's first bytes for its header), then kept current by this host's uploader,
/// folder and eraser, so that a restore reads only the objects of its user and a new user reads
/// none (docs/design.md, "The host log"). One host writes the log at a time (the writer lease):
/// after the listing, objects appear only through this host.
package final class LogIndex: Sendable {
    /// A log object, as its header says.
    package struct Entry: Sendable, Equatable {
        package var users: Set<String>
        package var position: LogObjectPosition
        package var createdAt: Date

        package init(users: Set<String>, position: LogObjectPosition, createdAt: Date) {
            self.users = users
            self.position = position
            self.createdAt = createdAt
        }

        package init(_ header: LogSegment.Header) {
            self.init(users: Set(header.users), position: LogObjectPosition(header), createdAt: RFC3339.parse(header.createdAt) ?? .distantPast)
        }
    }

    private struct State {
        var loaded = false
        /// Which listing counts (one begun before a ``reset()`` does not).
        var generation = 0
        var entries: [String: Entry] = [:]
        var keysOf: [String: Set<String>] = [:]
        /// Each user's folded objects (`users/…`).
        var foldsOf: [String: Set<String>] = [:]
        /// What this host changed while a listing ran (the listing may have missed it).
        var added: [String: Entry?] = [:]
        var foldsChanged: [String: Set<String>] = [:]
        /// The log's fences, and the objects they void (left for the fold to delete).
        var fences = LogFences()
        var void: Set<String> = []
        /// Users with a copy in Litestream's layout (`<ab>/<cd>/<user>/…`: replicated before
        /// `engine: log`), restored from it once when the log holds nothing of them.
        var legacy: Set<String> = []
    }

    private let state = Mutex(State())

    package init() {}

    /// Whether the listing is in.
    package var isLoaded: Bool { state.withLock { $0.loaded } }

    /// The keys of the log objects holding records of `user`, sorted; nil until the listing is in.
    package func keys(of user: String) -> [String]? {
        state.withLock { $0.loaded ? ($0.keysOf[user] ?? []).sorted() : nil }
    }

    /// The keys of `user`'s folded objects, sorted (oldest first); nil until the listing is in.
    package func folds(of user: String) -> [String]? {
        state.withLock { $0.loaded ? ($0.foldsOf[user] ?? []).sorted() : nil }
    }

    /// Whether `user` has a copy in Litestream's layout; nil until the listing is in.
    package func legacyHolds(_ user: String) -> Bool? {
        state.withLock { $0.loaded ? $0.legacy.contains(user) : nil }
    }

    /// `user`'s copy in Litestream's layout is gone (erased).
    package func forgetLegacy(_ user: String) {
        state.withLock { _ = $0.legacy.remove(user) }
    }

    /// The log's fences as listed; nil until the listing is in.
    package var fences: LogFences? { state.withLock { $0.loaded ? $0.fences : nil } }

    /// The fences known, listed or not (to read only new ones again).
    package var knownFences: LogFences { state.withLock { $0.fences } }

    /// The log objects the fences void, forgotten as they are returned (the fold deletes them).
    package func takeVoid() -> [String] {
        state.withLock { state in
            defer { state.void = [] }
            return state.void.sorted()
        }
    }

    /// How many users the log or the folds hold, once listed.
    package var users: Int? {
        state.withLock { $0.loaded ? Set($0.keysOf.keys).union($0.foldsOf.keys).count : nil }
    }

    /// How many log objects it knows, once listed.
    package var objects: Int? { state.withLock { $0.loaded ? $0.entries.count : nil } }

    /// Every log object it knows, oldest first (for the fold); empty until the listing is in.
    package var entries: [(key: String, entry: Entry)] {
        state.withLock { $0.loaded ? $0.entries.map { ($0.key, $0.value) }.sorted { ($0.entry.position, $0.key) < ($1.entry.position, $1.key) } : [] }
    }

    /// A log object this host stored.
    package func add(_ key: String, _ entry: Entry) {
        state.withLock { state in
            insert(key, entry, into: &state)
            if !state.loaded { state.added[key] = entry }
        }
    }

    /// A log object rewritten without some users (`users` is what is left) or, with none left,
    /// deleted.
    package func replace(_ key: String, users: Set<String>) {
        state.withLock { state in
            guard var entry = state.entries[key] else {
                if !state.loaded { state.added[key] = .some(nil) }
                return
            }
            remove(key, from: &state)
            entry.users = users
            if users.isEmpty {
                if !state.loaded { state.added[key] = .some(nil) }
            } else {
                insert(key, entry, into: &state)
                if !state.loaded { state.added[key] = entry }
            }
        }
    }

    /// `user`'s folded objects are now `keys`.
    package func setFolds(of user: String, _ keys: Set<String>) {
        state.withLock { state in
            state.foldsOf[user] = keys.isEmpty ? nil : keys
            if !state.loaded { state.foldsChanged[user] = keys }
        }
    }

    /// Forgets the listing (another host may have written the log): until it is listed again,
    /// restores read every object.
    package func reset() {
        state.withLock { state in state = State(generation: state.generation + 1) }
    }

    /// Lists the replica once: the fences, every log object under `log` (reading its header)
    /// that they let count, every folded object under `folds`, and the users with a copy in
    /// Litestream's layout.
    package func load(from storage: ReplicaStorage, log: String, folds: String) async throws {
        let generation = state.withLock { $0.generation }
        let fences = try await LogFences.load(from: storage)
        var entries: [String: Entry] = [:]
        var void: Set<String> = []
        var foldsOf: [String: Set<String>] = [:]
        var legacy: Set<String> = []
        let keys = try await storage.keys(under: "")
        // Each log object's header is a ranged read: `LogFolder.width` at a time.
        let headers = Mutex<[String: LogSegment.Header]>([:])
        try await keys.filter { $0.hasPrefix(log) && $0.hasSuffix(".usl") }.concurrentForEach(width: LogFolder.width) { key in
            guard let header = try await storage.header(of: key) else { return }
            headers.withLock { $0[key] = header }
        }
        let read = headers.withLock { $0 }
        for key in keys {
            if key.hasPrefix(log) {
                guard let header = read[key] else { continue }
                // A cluster's objects are judged record by record (each record's bucket and epoch).
                if header.cluster == true || fences.counts(key, epoch: header.epoch) { entries[key] = Entry(header) } else { void.insert(key) }
            } else if key.hasPrefix(folds) {
                if let user = LogFolder.user(ofFold: key) { foldsOf[user, default: []].insert(key) }
            } else if let user = Self.legacyUser(of: key) {
                legacy.insert(user)
            }
        }
        state.withLock { state in
            guard state.generation == generation else { return }
            for (key, entry) in entries { insert(key, entry, into: &state) }
            for (key, entry) in state.added {
                if let entry { insert(key, entry, into: &state) } else { remove(key, from: &state) }
            }
            state.foldsOf = foldsOf
            for (user, keys) in state.foldsChanged { state.foldsOf[user] = keys.isEmpty ? nil : keys }
            state.added = [:]
            state.foldsChanged = [:]
            state.fences = LogFences(fences.fences.merging(state.fences.fences) { listed, _ in listed })
            state.void = void
            state.legacy = legacy
            state.loaded = true
        }
    }

    /// Adds the log objects of `listed` (a listing of the log, made after this host fenced
    /// buckets it took in a cluster) it does not know, reading their headers, drops those of
    /// other data directories than `own` (`log/<id>/`) that are gone, and takes
    /// `fences` as the log's fences: in a cluster other hosts write the log too, and what they
    /// wrote of a bucket before this host fenced it is read from here on.
    package func refresh(from storage: ReplicaStorage, listed: [String], fences: LogFences, own: String) async throws {
        // Other hosts' objects gone since (folded by their hosts) leave the index; this host's
        // own are kept current by its uploader and fold.
        let present = Set(listed)
        state.withLock { state in
            for key in state.entries.keys where !key.hasPrefix(own) && !present.contains(key) { remove(key, from: &state) }
        }
        let known = state.withLock { Set($0.entries.keys) }
        let headers = Mutex<[String: LogSegment.Header]>([:])
        try await listed.filter { $0.hasSuffix(".usl") && !known.contains($0) }.concurrentForEach(width: LogFolder.width) { key in
            guard let header = try await storage.header(of: key) else { return }
            headers.withLock { $0[key] = header }
        }
        let read = headers.withLock { $0 }
        state.withLock { state in
            for (key, header) in read where state.entries[key] == nil { insert(key, Entry(header), into: &state) }
            state.fences = fences
        }
    }

    /// The log's fences are now `fences` (read again: in a cluster other hosts fence buckets).
    package func setFences(_ fences: LogFences) {
        state.withLock { $0.fences = fences }
    }

    /// The user whose copy in Litestream's layout `key` belongs to (`<ab>/<cd>/<user>/…`, two
    /// hex digits twice; in a cluster `<bucket>/<user>/e<epoch>/…`); nil for any other key.
    static func legacyUser(of key: String) -> String? {
        let parts = key.split(separator: "/", omittingEmptySubsequences: false)
        func hex2(_ part: Substring) -> Bool { part.count == 2 && part.allSatisfy(\.isHexDigit) }
        if parts.count >= 4, hex2(parts[0]), hex2(parts[1]), !parts[2].isEmpty { return String(parts[2]) }
        if parts.count >= 4, let bucket = Int(parts[0]), (0..<4096).contains(bucket), !parts[1].isEmpty,
           parts[2].first == "e", Int64(parts[2].dropFirst()) != nil {
            return String(parts[1])
        }
        return nil
    }

    private func insert(_ key: String, _ entry: Entry, into state: inout State) {
        remove(key, from: &state)
        state.entries[key] = entry
        for user in entry.users { state.keysOf[user, default: []].insert(key) }
    }

    private func remove(_ key: String, from state: inout State) {
        guard let entry = state.entries.removeValue(forKey: key) else { return }
        for user in entry.users {
            state.keysOf[user]?.remove(key)
            if state.keysOf[user]?.isEmpty == true { state.keysOf[user] = nil }
        }
    }
}

extension ReplicaStorage {
    /// The header of the log object `key`, read from its first 64 KiB (all of it when the header
    /// is longer); nil when there is no such object.
    package func header(of key: String) async throws -> LogSegment.Header? {
        guard let prefix = try await getPrefix(key, bytes: 65536) else { return nil }
        if let (header, _) = try LogSegment.header(of: prefix) { return header }
        guard let whole = try await get(key), let (header, _) = try LogSegment.header(of: whole) else {
            throw LogSegment.Damaged(description: "\(key) is truncated within its header")
        }
        return header
    }
}
