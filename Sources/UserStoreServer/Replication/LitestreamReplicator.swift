import Foundation
import GRDBSQLite
import Logging
import Synchronization
import UserStoreConfiguration
import UserStoreCore

/// Every open store replicated by Litestream (docs/replication.md): registered when it opens,
/// synced and unregistered when it closes, restored from the replica when it is missing here.
///
/// While Litestream cannot be reached the daemon goes on serving (degraded): stores open
/// unregistered and checkpoint themselves, durable writes fail with `ReplicationUnavailable`,
/// and ``reconcile()`` (run every second by ``ReplicationMonitor``) registers every open store
/// again once Litestream answers — also after Litestream restarted and forgot them.
final class LitestreamReplicator: StoreReplication {
    let settings: ReplicationSettings
    let layout: StoreLayout
    let control: LitestreamControl
    private let logger: Logger
    private let state = Mutex(State())

    private struct State {
        /// Open stores by path, and whether Litestream replicates them now.
        var open: [String: (store: Store, registered: Bool)] = [:]
        /// The last failure talking to Litestream, while it lasts.
        var lastError: String?
        var degradedSince: Date?
        /// Per registered path: when Litestream last synced it (`/list`).
        var lastSync: [String: Date] = [:]
        var litestreamPID = 0
        var litestreamVersion = ""
        /// Stores brought back from the replica since start.
        var restored = 0
    }

    init(settings: ReplicationSettings, layout: StoreLayout, logger: Logger) {
        self.settings = settings
        self.layout = layout
        self.control = LitestreamControl(socketPath: settings.socket)
        self.logger = logger
    }

    var sharesStoreFiles: Bool { true }

    /// `<replica>/<ab>/<cd>/<user>`, with any query (`s3://b/p?endpoint=…`) kept at the end.
    func replicaURL(for user: UserID) -> String {
        let suffix = "/" + StoreLayout.hashPrefix(of: user) + "/" + user.rawValue
        guard let query = settings.replica.firstIndex(of: "?") else { return settings.replica + suffix }
        var base = String(settings.replica[..<query])
        if base.hasSuffix("/") { base.removeLast() }
        return base + suffix + String(settings.replica[query...])
    }

    /// Litestream's state folder beside a store (`.<name>-litestream`).
    static func sidecar(of path: String) -> String {
        let url = URL(fileURLWithPath: path)
        return url.deletingLastPathComponent().path + "/." + url.lastPathComponent + "-litestream"
    }

    // MARK: StoreReplication

    func restore(_ user: UserID, to path: String, timestamp: Date?) throws -> ReplicaRestore? {
        let started = ContinuousClock.now
        let source = replicaURL(for: user)
        var arguments = ["restore", "-o", path, "-integrity-check", "quick"]
        if let timestamp {
            // RFC 3339 with milliseconds (Go's parser takes them): two writes within a second differ.
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            arguments += ["-timestamp", formatter.string(from: timestamp)]
        } else {
            arguments.append("-if-replica-exists")
        }
        arguments.append(source)
        let (status, output) = try run(arguments, user: user)
        let restored = FileManager.default.fileExists(atPath: path)
        if status != 0 || (timestamp != nil && !restored) {
            for suffix in ["", "-wal", "-shm", "-txid"] { unlink(path + suffix) }
            let message = Self.lastLines(output)
            if timestamp != nil, ["no matching backups", "no snapshots", "timestamp does not exist"].contains(where: message.contains) { return nil }
            if Self.isDamage(message) { throw StoreError.replicaDamaged(user: user, message: message) }
            throw StoreError.replicationUnavailable(user: user, message: "litestream restore exited \(status): \(message)")
        }
        guard restored else { return nil }
        state.withLock { $0.restored += 1 }
        return ReplicaRestore(source: source, schemaVersion: Self.userVersion(path),
                              durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds)
    }

    func storeOpened(_ store: Store) -> Bool {
        state.withLock { $0.open[store.path] = (store, false) }
        return register(store)
    }

    func storeClosing(_ store: Store) {
        guard let entry = state.withLock({ $0.open.removeValue(forKey: store.path) }) else { return }
        state.withLock { _ = $0.lastSync.removeValue(forKey: store.path) }
        guard entry.registered else {
            // Not registered as far as the daemon knows; a Litestream that has it anyway (its
            // registration raced an outage) must let go of a file that is about to change.
            try? control.unregister(store.path)
            return
        }
        do {
            // Litestream opens a registered database lazily (on its first sync, within a
            // second); unregistering one it has not opened yet skips the final sync. A sync
            // first opens it and copies everything; the unregister's own sync then finds little.
            _ = try control.syncAndWait(store.path, timeoutSeconds: max(1, settings.durableTimeoutMilliseconds / 1000))
            try control.unregister(store.path)
        } catch {
            failed("final sync of \(store.user)", error)
            try? control.unregister(store.path)
        }
    }

    func storeReplaced(_ user: UserID, path: String, deleteReplica: Bool) throws {
        try? FileManager.default.removeItem(atPath: Self.sidecar(of: path))
        guard deleteReplica else { return }
        let url = replicaURL(for: user)
        guard url.hasPrefix("file://") else {
            throw StoreError.replicationUnavailable(user: user, message: "userstored deletes only file:// replicas; delete \(url) with the storage's own tools, then delete the store")
        }
        let folder = String(url.dropFirst(7))
        do {
            if FileManager.default.fileExists(atPath: folder) { try FileManager.default.removeItem(atPath: folder) }
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "deleting the replica \(folder): \(error)")
        }
    }

    // MARK: Durable writes

    /// Waits until every transaction committed to `user`'s store so far is in the replica.
    /// Throws ``StoreError/replicationUnavailable(user:message:)`` when that cannot be confirmed.
    func waitUntilReplicated(_ user: UserID) async throws {
        let path = layout.storePath(for: user)
        guard let store = state.withLock({ $0.open[path] }).flatMap({ $0.registered ? $0.store : nil }) else {
            throw StoreError.replicationUnavailable(user: user, message: "the store is not registered with Litestream (\(state.withLock { $0.lastError } ?? "not open"))")
        }
        let timeout = max(1, settings.durableTimeoutMilliseconds / 1000)
        // This sync covers every commit so far: the next sync pass need not repeat it (a commit
        // after this point sets the flag again).
        let written = store.commits.take()
        do {
            let reply = try await control.syncAndWait(path, timeoutSeconds: timeout)
            guard reply.status == "no_change" || (reply.status == "synced" && reply.replicatedTXID >= reply.txid) else {
                throw LitestreamControl.Failure(description: "sync ended \(reply.status) at txid \(reply.txid), replica at \(reply.replicatedTXID)")
            }
        } catch {
            if written { store.commits.restore() }
            failed("sync \(user)", error)
            throw StoreError.replicationUnavailable(user: user, message: "\(error)")
        }
    }

    /// Syncs every registered store written since the last pass to the replica, waiting for
    /// each (at most 16 at a time). Run every quarter of ``ReplicationSettings/syncIntervalMilliseconds``
    /// by ``ReplicationMonitor``, so that a write acknowledged one interval ago is in the replica
    /// (Litestream's own loops alone took up to 1.3 s with its fixed 1 s interval: a local pass,
    /// then an upload pass, each on its own ticker). Returns how many stores it synced.
    @discardableResult
    func syncWrittenStores() async -> Int {
        let written = state.withLock { state in
            state.open.values.filter { $0.registered && $0.store.commits.take() }.map(\.store)
        }
        let timeout = max(1, settings.durableTimeoutMilliseconds / 1000)
        let control = self.control
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            for store in written {
                if running == 16 {
                    await group.next()
                    running -= 1
                }
                running += 1
                group.addTask {
                    do {
                        _ = try await control.syncAndWait(store.path, timeoutSeconds: timeout)
                    } catch {
                        // Closed meanwhile: its final sync covered it (not an outage).
                        guard self.isRegistered(store) else { return }
                        store.commits.restore()
                        self.failed("sync \(store.user)", error)
                    }
                }
            }
        }
        return written.count
    }

    // MARK: Health

    /// What `Status` and `userstorectl replication` show.
    struct Snapshot: Sendable {
        var registered: Int
        var unregistered: Int
        var lastError: String?
        var degradedSince: Date?
        var litestreamPID: Int
        var litestreamVersion: String
        var restored: Int
        /// Per open store: path, registered, last sync.
        var stores: [(user: String, registered: Bool, lastSync: Date?)]
        var degraded: Bool { unregistered > 0 || lastError != nil }
        /// The longest time since Litestream last synced an open, registered store.
        var maxLagSeconds: Double {
            let now = Date()
            return stores.filter(\.registered).compactMap { $0.lastSync.map { now.timeIntervalSince($0) } }.max() ?? 0
        }
    }

    var snapshot: Snapshot {
        state.withLock { state in
            let stores = state.open.map { path, entry in (user: entry.store.user.rawValue, registered: entry.registered, lastSync: state.lastSync[path]) }
            return Snapshot(registered: stores.filter(\.registered).count, unregistered: stores.filter { !$0.registered }.count,
                            lastError: state.lastError, degradedSince: state.degradedSince, litestreamPID: state.litestreamPID,
                            litestreamVersion: state.litestreamVersion, restored: state.restored, stores: stores.sorted { $0.user < $1.user })
        }
    }

    /// Compares what Litestream replicates with the open stores and registers what it lacks
    /// (stores opened while it was down, or every store after it restarted). Blocking.
    func reconcile() {
        let listed: [LitestreamControl.ListedDatabase]
        do {
            let info = try control.info()
            listed = try control.list()
            state.withLock { state in
                state.litestreamPID = info.pid
                state.litestreamVersion = info.version
            }
        } catch {
            let lost = state.withLock { state -> [Store] in
                let lost = state.open.values.filter(\.registered).map(\.store)
                for path in state.open.keys { state.open[path]!.registered = false }
                return lost
            }
            // Nobody checkpoints them until they are registered again.
            for store in lost { store.enqueue({ db in try? db.execute(sql: "PRAGMA wal_autocheckpoint = 1000") }, completion: { _ in }) }
            failed("health check", error)
            return
        }
        let replicating = Set(listed.filter { $0.status == "replicating" }.map(\.path))
        let missing: [Store] = state.withLock { state in
            for database in listed { state.lastSync[database.path] = database.lastSyncAt }
            return state.open.values.filter { !replicating.contains($0.store.path) }.map(\.store)
        }
        var allRegistered = true
        for store in missing {
            if register(store) {
                // It checkpointed itself while unregistered; Litestream checkpoints from now on.
                store.enqueue({ db in
                    try? db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
                    store.commits.install(on: db.sqliteConnection!)
                    store.commits.restore() // what it wrote unregistered: synced by the next pass
                }, completion: { _ in })
            } else {
                allRegistered = false
            }
        }
        if allRegistered { recovered() }
    }

    // MARK: Helpers

    private func isRegistered(_ store: Store) -> Bool {
        state.withLock { $0.open[store.path].map { $0.store === store && $0.registered } ?? false }
    }

    private func register(_ store: Store) -> Bool {
        do {
            try control.register(store.path, replicaURL: replicaURL(for: store.user))
            let stillOpen = state.withLock { state -> Bool in
                guard state.open[store.path]?.store === store else { return false }
                state.open[store.path]!.registered = true
                return true
            }
            // Closed while ``reconcile()`` registered it again: Litestream must not keep it.
            if !stillOpen { try? control.unregister(store.path) }
            return true
        } catch {
            failed("register \(store.user)", error)
            return false
        }
    }

    /// Records a failure; the first one of an outage is logged as `replication-degraded`.
    private func failed(_ what: String, _ error: any Error) {
        let message = "\(what): \(error)"
        let first = state.withLock { state -> Bool in
            defer { state.lastError = message }
            guard state.degradedSince == nil else { return false }
            state.degradedSince = Date()
            return true
        }
        if first {
            logger.error("replication degraded: \(message); serving on, stores are registered again when Litestream answers", metadata: [
                "event": "replication-degraded", "error": .string(message),
            ])
        }
    }

    private func recovered() {
        let since = state.withLock { state -> Date? in
            defer { state.degradedSince = nil; state.lastError = nil }
            return state.degradedSince
        }
        if let since {
            logger.notice("replication recovered: every open store is registered again", metadata: [
                "event": "replication-recovered", "degraded_seconds": .stringConvertible(Int(Date().timeIntervalSince(since))),
            ])
        }
    }

    /// Runs the litestream binary; returns its exit status and its output (stdout and stderr).
    /// The output goes to a temporary file, not a pipe: a pipe's write end inherited by a
    /// process started at the same moment (the child Litestream, another restore) would keep
    /// the read from ever ending. A run longer than the durable time-out is killed.
    private func run(_ arguments: [String], user: UserID) throws -> (Int32, String) {
        let outputPath = NSTemporaryDirectory() + "userstored-litestream-\(UUID().uuidString).log"
        guard FileManager.default.createFile(atPath: outputPath, contents: nil), let output = FileHandle(forWritingAtPath: outputPath) else {
            throw StoreError.replicationUnavailable(user: user, message: "cannot create \(outputPath) for litestream's output")
        }
        defer {
            try? output.close()
            unlink(outputPath)
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.resolve(settings.litestream))
        process.arguments = arguments
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }
        do {
            try process.run()
        } catch {
            throw StoreError.replicationUnavailable(user: user, message: "cannot run \(settings.litestream): \(error)")
        }
        let limit = max(30, settings.durableTimeoutMilliseconds / 1000 * 6)
        if exited.wait(timeout: .now() + .seconds(limit)) == .timedOut {
            kill(process.processIdentifier, SIGKILL)
            exited.wait()
            throw StoreError.replicationUnavailable(user: user, message: "litestream \(arguments.first ?? "") did not finish within \(limit) s")
        }
        let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
        return (process.terminationStatus, text)
    }

    /// `name` found in `$PATH` (Process needs a path), or `name` itself.
    static func resolve(_ name: String) -> String {
        guard !name.contains("/") else { return name }
        for folder in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":") {
            let candidate = "\(folder)/\(name)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return name
    }

    /// Litestream's last log lines without their timestamps: the reason it gives.
    private static func lastLines(_ output: String) -> String {
        let lines = output.split(separator: "\n").map { line -> String in
            if let message = line.range(of: "msg=") { return String(line[message.upperBound...]) }
            return String(line)
        }
        return lines.suffix(2).joined(separator: "; ")
    }

    /// Whether Litestream's failure says the replica's data is bad rather than unreachable.
    private static func isDamage(_ message: String) -> Bool {
        let lowered = message.lowercased()
        return ["integrity", "checksum", "corrupt", "malformed", "invalid ltx", "decode", "unexpected eof", "magic"].contains { lowered.contains($0) }
    }

    private static func userVersion(_ path: String) -> Int64 {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK else { return -1 }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(connection, "PRAGMA user_version", -1, &statement, nil) == SQLITE_OK,
              sqlite3_step(statement) == SQLITE_ROW else { return -1 }
        return sqlite3_column_int64(statement, 0)
    }
}
