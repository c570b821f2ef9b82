import Logging
import Synchronization

/// A local copy of every key under an etcd prefix, decoded, kept current by a watch: the
/// request path reads it without waiting for etcd or decoding anything. After a lost watch (a
/// member gone, a compaction) it takes a new snapshot and watches again from there, so it never
/// misses a change for good. Keys whose value does not decode are left out (and logged).
public final class PrefixMirror<Value: Sendable>: Sendable {
    /// One key's decoded value and the revision of its last change (a bucket's epoch).
    public struct Entry: Sendable {
        public let value: Value
        public let modRevision: Int64
    }

    public let prefix: String
    private let etcd: EtcdClient
    private let decode: @Sendable (EtcdKeyValue) -> Value?
    private let logger: Logger
    private let state = Mutex<State>(State())

    private struct State {
        var entries: [String: Entry] = [:]
        var revision: Int64 = 0
        /// The revision of the last snapshot: events up to it are in it already (a watch begun
        /// before a later ``refresh()`` may still deliver them, and must not undo it).
        var snapshotRevision: Int64 = 0
    }

    public init(etcd: EtcdClient, prefix: String, logger: Logger = Logger(label: "userstore.cluster"),
                decode: @escaping @Sendable (EtcdKeyValue) -> Value?) {
        self.etcd = etcd
        self.prefix = prefix
        self.decode = decode
        self.logger = logger
    }

    /// The entry named `name` (the key without the prefix), as last seen.
    public subscript(name: String) -> Entry? { state.withLock { $0.entries[name] } }

    /// Every entry as last seen, by name.
    public var all: [String: Entry] { state.withLock { $0.entries } }

    /// The store revision the copy is current to (0 before the first snapshot).
    public var revision: Int64 { state.withLock { $0.revision } }

    /// Takes a snapshot now (also what ``run()`` starts with). A watch may run meanwhile: a
    /// snapshot older than what it already applied would undo those changes (a deleted key
    /// back, a move forgotten) and the watch would not deliver them again, so such a snapshot
    /// is taken again, up to 10 times; after that the copy stays as the watch keeps it.
    public func refresh() async throws {
        for _ in 0..<10 {
            let snapshot = try await etcd.snapshot(prefix: prefix)
            var entries: [String: Entry] = [:]
            for item in snapshot.keys { if let entry = entry(item) { entries[name(of: item)] = entry } }
            let taken = state.withLock { state -> Bool in
                guard state.revision <= snapshot.revision else { return false }
                state.entries = entries
                state.revision = snapshot.revision
                state.snapshotRevision = snapshot.revision
                return true
            }
            if taken { return }
        }
    }

    /// Snapshots and watches until cancelled; a failure is retried after `retry`.
    public func run(retry: Duration = .milliseconds(500)) async {
        while !Task.isCancelled {
            do {
                try await refresh()
                for try await events in etcd.watch(prefix: prefix, fromRevision: revision + 1) {
                    apply(events)
                }
            } catch {
                if Task.isCancelled { return }
                logger.warning("watching \(prefix) in etcd failed: \(error); reading it again", metadata: [
                    "event": "cluster-unreachable", "prefix": .string(prefix), "error": .string("\(error)"),
                ])
            }
            try? await Task.sleep(for: retry) // back-off before asking etcd again
        }
    }

    func apply(_ events: [EtcdEvent]) {
        let changes = events.map { event in (name(of: event.keyValue), event.deleted ? nil : entry(event.keyValue), event.keyValue.modRevision) }
        state.withLock { state in
            for (name, entry, revision) in changes where revision > state.snapshotRevision {
                state.entries[name] = entry
                state.revision = max(state.revision, revision)
            }
        }
    }

    private func name(of item: EtcdKeyValue) -> String { String(item.key.dropFirst(prefix.count)) }

    private func entry(_ item: EtcdKeyValue) -> Entry? {
        guard let value = decode(item) else {
            logger.warning("etcd key \(item.key) holds a value userstore cannot read: left out", metadata: ["event": "cluster-bad-record", "key": .string(item.key)])
            return nil
        }
        return Entry(value: value, modRevision: item.modRevision)
    }
}
