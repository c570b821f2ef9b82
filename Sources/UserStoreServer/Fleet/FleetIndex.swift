import Foundation
import GRDB
import Synchronization
import UserStoreCluster
import UserStoreCore
import UserStoreProtocol

/// The schema version and state of every store in the data directory, for `Status`,
/// `ListStores` and `Migrate --all` without opening 100,000 files per call.
///
/// Built by ``scan(layout:)`` at start-up (reading each file's header, a 100-byte read) and kept
/// current from ``StoreEvent``s as stores are created, migrated and refused.
final class FleetIndex: StoreObserver {
    enum State: String, Sendable {
        case current, pending, failed
        case tooNew = "too_new"
        case unknown
    }

    struct Entry: Sendable, Equatable {
        /// -1 when unknown.
        var version: Int64
        /// The user's cluster bucket (``Placement/bucket(for:)``), hashed once: a cluster host
        /// counts and lists only the stores of the buckets it owns.
        let bucket: Int
        var failure: String?
        var failureName: String?
        var tooNew = false
        /// Its file is encrypted (docs/encryption.md): as the start-up scan read it, then as of
        /// its last open (with encryption on, every store opened is encrypted).
        var encrypted = false

        init(version: Int64, bucket: Int) {
            self.version = version
            self.bucket = bucket
        }

        init(_ user: UserID, version: Int64) {
            self.init(version: version, bucket: Placement.bucket(for: user))
        }
    }

    private let entries = Mutex<[UserID: Entry]>([:])
    /// Encryption is on: a store created, opened or restored is encrypted.
    private let encrypting: Bool
    private let complete = Atomic<Bool>(false)
    private let scanTask = Mutex<Task<Void, Never>?>(nil)
    /// The buckets this host serves now (``serveOnly(_:)``); nil: every store (one host).
    private let servedBuckets = Mutex<(@Sendable () -> Set<Int>)?>(nil)

    /// An index of stores encrypted when `encrypting` (encryption is on) once opened.
    init(encrypting: Bool = false) {
        self.encrypting = encrypting
    }

    /// In a cluster: the stores this host serves are those of `buckets()` (the ones it owns);
    /// the copies it keeps of buckets it gave away stay in the index, counted apart.
    func serveOnly(_ buckets: @escaping @Sendable () -> Set<Int>) {
        servedBuckets.withLock { $0 = buckets }
    }

    /// Whether this host serves the store of an entry, by the buckets it serves now: take it once
    /// per pass over the index (`let serves = index.servesEntry()`).
    func servesEntry() -> (Entry) -> Bool {
        guard let owned = servedBuckets.withLock({ $0 })?() else { return { _ in true } }
        return { owned.contains($0.bucket) }
    }

    /// Whether the start-up scan has finished.
    var isComplete: Bool { complete.load(ordering: .acquiring) }

    /// Starts the scan of `registry`'s data directory in the background.
    func startScan(registry: StoreRegistry) {
        scanTask.withLock { task in
            guard task == nil else { return }
            task = Task.detached(priority: .utility) { await self.scan(registry: registry) }
        }
    }

    /// Returns once the scan has finished.
    func waitForScan() async {
        await scanTask.withLock { $0 }?.value
    }

    /// Reads every store's version from its header. Entries recorded by events while the scan
    /// runs are newer and are kept. A store with a WAL (left by a crash; kept at close when
    /// replicated) is read through SQLite: a replicated one through a read-only connection,
    /// another through the registry (the daemon's one connection per file, locked exclusively).
    private func scan(registry: StoreRegistry) async {
        let layout = registry.configuration.layout
        // Directory listings and header reads block on the disk: the blocking pool's threads,
        // never the cooperative ones (docs/design.md). The work throws nothing.
        let users = await BlockingPool.run { layout.allUsers() }
        for chunk in stride(from: 0, to: users.count, by: 512) {
            let slice = users[chunk..<min(chunk + 512, users.count)]
            // A store whose WAL is not empty (a crash, or a replicated store closed before the
            // replica had its last commits) is opened to read its version: SQLite reads it
            // through the WAL, with the store's own connection.
            var read = await BlockingPool.run {
                slice.map { user -> (UserID, Int64?, bucket: Int, encrypted: Bool) in
                    let header = StoreFileInspector.header(of: layout.storePath(for: user))
                    return (user, header.version, Placement.bucket(for: user), header.encrypted)
                }
            }
            for (offset, (user, version, _, _)) in read.enumerated() where version == nil {
                let current = try? await registry.withExistingStore(user) { store in try await store.schemaVersion() }
                read[offset].1 = current ?? -1
            }
            entries.withLock { entries in
                for (user, version, bucket, encrypted) in read where entries[user] == nil {
                    var entry = Entry(version: version ?? -1, bucket: bucket)
                    entry.encrypted = encrypted
                    entries[user] = entry
                }
            }
        }
        complete.store(true, ordering: .releasing)
    }

    func record(_ event: StoreEvent) {
        entries.withLock { entries in
            let user = event.user
            var entry = entries[user] ?? Entry(user, version: 0)
            switch event {
            case .storeCreated:
                entry = Entry(version: 0, bucket: entry.bucket)
                entry.encrypted = encrypting
            case .migrationStep(_, let version, _, _, _, _, _):
                entry.version = max(entry.version, version)
            case .migrationFinished(_, _, let to, _, _):
                entry.version = to
                entry.failure = nil
                entry.failureName = nil
            case .migrationFailed(_, let error):
                entry.failure = error.description
                entry.failureName = error.varlinkError.name
                if case .migrationFailed(_, _, _, _, _, let schemaVersion) = error { entry.version = schemaVersion }
            case .storeRefused(_, let error):
                if case .storeTooNew(_, let storeVersion, _) = error {
                    entry.version = storeVersion
                    entry.tooNew = true
                } else {
                    entry.failure = error.description
                    entry.failureName = error.varlinkError.name
                }
            case .storeDeleted:
                entries[user] = nil
                return
            case .storeImported(_, let version, _, _):
                // Encrypted in the staging folder when encryption is on.
                entry = Entry(version: version, bucket: entry.bucket)
                entry.encrypted = encrypting
            case .storeRestored(_, _, let version, _):
                entry = Entry(version: version, bucket: entry.bucket)
                entry.encrypted = encrypting
            case .storeOpened:
                guard encrypting, !entry.encrypted else { return }
                entry.encrypted = true
            case .rollbackStep, .backupCreated, .migrationStarted, .unknownAppliedMigration, .storeClosed, .storeSuperseded:
                return
            }
            entries[user] = entry
        }
    }

    /// Records the outcome of an explicit migration or rollback.
    func update(_ user: UserID, version: Int64, failure: StoreError?) {
        entries.withLock { entries in
            var entry = entries[user] ?? Entry(user, version: version)
            entry.version = version
            entry.failure = failure?.description
            entry.failureName = failure?.varlinkError.name
            if failure == nil { entry.tooNew = false }
            entries[user] = entry
        }
    }

    static func state(of entry: Entry, latest: Int64) -> State {
        if entry.tooNew || entry.version > latest { return .tooNew }
        if entry.failure != nil { return .failed }
        if entry.version < 0 { return .unknown }
        return entry.version == latest ? .current : .pending
    }

    /// Every store this host serves (``servesEntry()``), sorted by user.
    func servedSnapshot() -> [(UserID, Entry)] {
        let serves = servesEntry()
        return entries.withLock { entries in entries.filter { serves($0.value) }.sorted { $0.key < $1.key } }
    }

    /// `body`'s answer from every entry as they are now, unsorted (no copy of 100,000 entries).
    func reading<T>(_ body: ([UserID: Entry]) -> T) -> T {
        entries.withLock { body($0) }
    }

    /// How many of the stores this host serves are in each state, and how many copies of other
    /// hosts' stores it keeps besides (0 on one host): what Status, the metrics and systemd's
    /// status line count.
    func counts(latest: Int64) -> (served: [State: Int], otherHosts: Int) {
        let serves = servesEntry()
        return entries.withLock { entries in
            var counts: [State: Int] = [:], others = 0
            for entry in entries.values {
                if serves(entry) { counts[Self.state(of: entry, latest: latest), default: 0] += 1 } else { others += 1 }
            }
            return (counts, others)
        }
    }

    /// How many of the stores this host serves are encrypted, and how many are plaintext.
    func encryptionCounts() -> (encrypted: Int, plaintext: Int) {
        let serves = servesEntry()
        return entries.withLock { entries in
            var encrypted = 0, plaintext = 0
            for entry in entries.values where serves(entry) {
                if entry.encrypted { encrypted += 1 } else { plaintext += 1 }
            }
            return (encrypted, plaintext)
        }
    }
}
