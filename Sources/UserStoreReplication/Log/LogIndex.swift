import Foundation
import Synchronization

/// Which log objects hold which users: read from every object's header once (a ranged read of its
/// first bytes) when the daemon starts holding the replica, then kept current by this host's
/// uploader, so that a restore reads only the objects of its user and a new user reads none
/// (docs/design.md, "The host log"). One host writes the log at a time (the writer lease): after
/// the listing, objects appear only through this host.
package final class LogIndex: Sendable {
    private struct State {
        var loaded = false
        /// Which listing counts (one begun before a ``reset()`` does not).
        var generation = 0
        var usersOf: [String: Set<String>] = [:]
        var keysOf: [String: Set<String>] = [:]
        /// Objects this host wrote while a listing ran (it may have missed them).
        var added: [String: Set<String>] = [:]
        var removed: Set<String> = []
    }

    private let state = Mutex(State())

    package init() {}

    /// Whether the listing is in.
    package var isLoaded: Bool { state.withLock { $0.loaded } }

    /// The keys of the objects holding records of `user`, sorted; nil until the listing is in.
    package func keys(of user: String) -> [String]? {
        state.withLock { $0.loaded ? ($0.keysOf[user] ?? []).sorted() : nil }
    }

    /// How many objects it knows, once listed.
    package var objects: Int? { state.withLock { $0.loaded ? $0.usersOf.count : nil } }

    /// Every object it knows, with its users (for the fold, which deletes what it folded).
    package var all: [String: Set<String>] { state.withLock { $0.usersOf } }

    /// An object this host stored, with the users it holds.
    package func add(_ key: String, users: Set<String>) {
        state.withLock { state in
            insert(key, users, into: &state)
            if !state.loaded { state.added[key] = users }
        }
    }

    /// An object that is gone (deleted, or rewritten without some users: then `users` is what is left).
    package func replace(_ key: String, users: Set<String>) {
        state.withLock { state in
            remove(key, from: &state)
            if users.isEmpty {
                if !state.loaded { state.removed.insert(key) }
            } else {
                insert(key, users, into: &state)
                if !state.loaded { state.added[key] = users }
            }
        }
    }

    /// Forgets the listing (another host may have written the log): until it is listed again,
    /// restores read every object.
    package func reset() {
        state.withLock { state in state = State(generation: state.generation + 1) }
    }

    /// Lists every object under `folder` and reads its header. Blocking.
    package func load(from storage: ReplicaStorage, folder: String) throws {
        let generation = state.withLock { $0.generation }
        var usersOf: [String: Set<String>] = [:]
        for key in try storage.keys(under: folder) where key.hasSuffix(".usl") {
            guard let header = try storage.header(of: key) else { continue }
            usersOf[key] = Set(header.users)
        }
        state.withLock { state in
            guard state.generation == generation else { return }
            for (key, users) in usersOf where !state.removed.contains(key) { insert(key, users, into: &state) }
            for (key, users) in state.added { insert(key, users, into: &state) }
            state.added = [:]
            state.removed = []
            state.loaded = true
        }
    }

    private func insert(_ key: String, _ users: Set<String>, into state: inout State) {
        remove(key, from: &state)
        state.usersOf[key] = users
        for user in users { state.keysOf[user, default: []].insert(key) }
    }

    private func remove(_ key: String, from state: inout State) {
        guard let users = state.usersOf.removeValue(forKey: key) else { return }
        for user in users {
            state.keysOf[user]?.remove(key)
            if state.keysOf[user]?.isEmpty == true { state.keysOf[user] = nil }
        }
    }
}

extension ReplicaStorage {
    /// The header of the log object `key`, read from its first 64 KiB (all of it when the header
    /// is longer); nil when there is no such object. Blocking.
    package func header(of key: String) throws -> LogSegment.Header? {
        guard let prefix = try getPrefix(key, bytes: 65536) else { return nil }
        if let (header, _) = try LogSegment.header(of: prefix) { return header }
        guard let whole = try get(key), let (header, _) = try LogSegment.header(of: whole) else {
            throw LogSegment.Damaged(description: "\(key) is truncated within its header")
        }
        return header
    }

    /// The first `bytes` bytes of the object `key` (fewer when it is shorter); nil when there is none.
    package func getPrefix(_ key: String, bytes: Int) throws -> [UInt8]? {
        switch kind {
        case .folder(let root):
            let path = root + "/" + key
            let descriptor = open(path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                if errno == ENOENT { return nil }
                throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            defer { close(descriptor) }
            var buffer = [UInt8](repeating: 0, count: bytes)
            let read = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, bytes, 0) }
            guard read >= 0 else { throw FolderProblem(name: "ReplicaUnreadable", detail: "cannot read \(path): \(String(cString: strerror(errno)))") }
            return Array(buffer.prefix(read))
        case .bucket(let client, let bucket, let prefix):
            let full = Self.key(prefix, "/" + key)
            return try Self.blocking { try await client.getObject(bucket: bucket, key: full, range: 0..<bytes) }.map { Array($0.body) }
        case .elsewhere:
            return nil
        }
    }
}
