import Logging
import Synchronization

/// A local copy of every key under an etcd prefix, kept current by a watch: the request path
/// reads it without waiting for etcd. After a lost watch (a member gone, a compaction) it takes
/// a new snapshot and watches again from there, so it never misses a change for good.
public final class PrefixMirror: Sendable {
    public let prefix: String
    private let etcd: EtcdClient
    private let logger: Logger
    private let state = Mutex<State>(State())

    private struct State {
        var keys: [String: EtcdKeyValue] = [:]
        var revision: Int64 = 0
    }

    public init(etcd: EtcdClient, prefix: String, logger: Logger = Logger(label: "userstore.cluster")) {
        self.etcd = etcd
        self.prefix = prefix
        self.logger = logger
    }

    /// The key's value as last seen (the key relative to the prefix).
    public subscript(name: String) -> EtcdKeyValue? { state.withLock { $0.keys[prefix + name] } }

    /// Every key as last seen, by name relative to the prefix.
    public var all: [String: EtcdKeyValue] {
        state.withLock { state in
            Dictionary(uniqueKeysWithValues: state.keys.map { (String($0.key.dropFirst(prefix.count)), $0.value) })
        }
    }

    /// The store revision the copy is current to (0 before the first snapshot).
    public var revision: Int64 { state.withLock { $0.revision } }

    /// Takes a snapshot now (also what ``run()`` starts with).
    public func refresh() async throws {
        let snapshot = try await etcd.snapshot(prefix: prefix)
        state.withLock { state in
            state.keys = Dictionary(uniqueKeysWithValues: snapshot.keys.map { ($0.key, $0) })
            state.revision = snapshot.revision
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
                    "event": "cluster-watch-failed", "prefix": .string(prefix), "error": .string("\(error)"),
                ])
            }
            try? await Task.sleep(for: retry) // back-off before asking etcd again
        }
    }

    func apply(_ events: [EtcdEvent]) {
        state.withLock { state in
            for event in events {
                if event.deleted {
                    state.keys[event.keyValue.key] = nil
                } else {
                    state.keys[event.keyValue.key] = event.keyValue
                }
                state.revision = max(state.revision, event.keyValue.modRevision)
            }
        }
    }
}
