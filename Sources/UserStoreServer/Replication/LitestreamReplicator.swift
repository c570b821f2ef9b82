import Foundation
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
        /// Paths whose unregistration Litestream did not confirm: not replaced until it does.
        var unconfirmed: Set<String> = []
        /// With more than one host: the epoch each open store was last registered under.
        var epochs: [String: Int64] = [:]
    }

    /// With more than one host: each user's bucket and its epoch, which fence the replica paths.
    let fencing: (any ReplicaFencing)?

    init(settings: ReplicationSettings, layout: StoreLayout, logger: Logger, fencing: (any ReplicaFencing)? = nil) {
        self.settings = settings
        self.layout = layout
        self.fencing = fencing
        self.control = LitestreamControl(socketPath: settings.socket)
        self.logger = logger
    }

    /// Where this host replicates `user` to: `<replica>/<ab>/<cd>/<user>`; with more than one
    /// host `<replica>/<bucket>/<user>/e<epoch>` (the bucket's epoch now). Any query
    /// (`s3://b/p?endpoint=…`) is kept at the end.
    func replicaURL(for user: UserID) -> String {
        guard let fencing else { return withSuffix(userFolderSuffix(user)) }
        return withSuffix(userFolderSuffix(user) + "/e\(fencing.epoch(of: user) ?? 0)")
    }

    /// The folder holding everything replicated for `user` (every epoch, with more than one host).
    private func userFolderSuffix(_ user: UserID) -> String {
        guard let fencing else { return "/" + StoreLayout.hashPrefix(of: user) + "/" + user.rawValue }
        return "/\(fencing.bucket(of: user))/" + user.rawValue
    }

    /// Where a restore of `user` reads: the replica URL; with more than one host the newest
    /// epoch folder that holds data (a host that lost the bucket may still ship to an older
    /// one, which is then never read again once the new owner has written).
    func restoreURL(for user: UserID) -> String {
        guard let epoch = newestEpochWithData(user) else { return replicaURL(for: user) }
        return withSuffix(userFolderSuffix(user) + "/e\(epoch)")
    }

    /// The newest epoch folder of `user` in a file:// replica that holds data (more than one host).
    private func newestEpochWithData(_ user: UserID) -> Int64? {
        guard fencing != nil, settings.replica.hasPrefix("file://") else { return nil }
        let folder = String(withSuffix(userFolderSuffix(user)).dropFirst(7))
        let epochs = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [])
            .compactMap { name -> Int64? in name.hasPrefix("e") ? Int64(name.dropFirst()) : nil }
            .sorted(by: >)
        return epochs.first { !(FileManager.default.subpaths(atPath: "\(folder)/e\($0)") ?? []).filter { $0.hasSuffix(".ltx") }.isEmpty }
    }

    private func withSuffix(_ suffix: String) -> String {
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
        let source = restoreURL(for: user)
        // Litestream renames its output into place before its integrity check: restore beside
        // the target and rename only after a clean exit, so a killed or failed restore never
        // leaves an unchecked file where the store is looked for.
        let staged = path + ".restoring"
        let cleanUp = { for suffix in ["", "-wal", "-shm", "-txid", ".tmp"] { unlink(staged + suffix) } }
        cleanUp()
        defer { cleanUp() }
        var arguments = ["restore", "-o", staged, "-integrity-check", "quick"]
        if let timestamp {
            arguments += ["-timestamp", RFC3339.format(timestamp)]
        } else {
            arguments.append("-if-replica-exists")
        }
        arguments.append(source)
        let (status, output) = try run(arguments, user: user)
        let restored = FileManager.default.fileExists(atPath: staged)
        if status != 0 || (timestamp != nil && !restored) {
            let message = Self.lastLines(output)
            if timestamp != nil, ["no matching backups", "no snapshots", "timestamp does not exist"].contains(where: message.contains) { return nil }
            if Self.isDamage(message) { throw StoreError.replicaDamaged(user: user, message: message) }
            throw StoreError.replicationUnavailable(user: user, message: "litestream restore exited \(status): \(message)")
        }
        guard restored else { return nil }
        let schemaVersion = StoreFileInspector.schemaVersion(of: staged)
        do {
            try DurableFile.publish(staged, as: path)
        } catch {
            throw StoreError.storageFailure(user: user, message: "putting the restored copy in place: \(error)")
        }
        state.withLock { $0.restored += 1 }
        return ReplicaRestore(source: source, schemaVersion: schemaVersion,
                              durationMicroseconds: (ContinuousClock.now - started).wholeMicroseconds)
    }

    /// The epoch `user`'s open store was registered under (more than one host); nil otherwise.
    func registeredEpoch(of user: UserID) -> Int64? {
        state.withLock { $0.epochs[layout.storePath(for: user)] }
    }

    func newerCopy(of user: UserID, path: String) -> Int64? {
        guard fencing != nil, let newest = newestEpochWithData(user) else { return nil }
        let local = (try? String(contentsOfFile: Self.epochFile(of: path), encoding: .utf8)).flatMap { Int64($0) } ?? 0
        return newest > local ? newest : nil
    }

    /// The epoch this host last replicated the store at `path` under (more than one host),
    /// beside the store: a later open compares it with the replica's newest epoch.
    static func epochFile(of path: String) -> String {
        let url = URL(fileURLWithPath: path)
        return url.deletingLastPathComponent().path + "/." + url.lastPathComponent + "-epoch"
    }

    func storeOpened(_ store: Store) {
        state.withLock { $0.open[store.path] = (store, false) }
        _ = register(store)
    }

    func storeClosing(_ store: Store) {
        // Only this store's own entry: a request may already have opened the file again (a new
        // Store), whose registration must stay.
        let entry = state.withLock { state -> (store: Store, registered: Bool)? in
            guard state.open[store.path]?.store === store else { return nil }
            state.lastSync[store.path] = nil
            state.epochs[store.path] = nil
            return state.open.removeValue(forKey: store.path)
        }
        guard let entry else { return }
        if entry.registered {
            do {
                // Litestream opens a registered database lazily (on its first sync, within a
                // second); unregistering one it has not opened yet skips the final sync. A sync
                // first opens it and copies everything; the unregister's own sync finds little.
                _ = try control.syncAndWait(store.path, timeoutSeconds: durableTimeoutSeconds)
            } catch {
                failed("final sync of \(store.user)", error)
            }
        }
        // Also when not registered as far as the daemon knows: a Litestream that has it anyway
        // (a registration that raced an outage) must let go of a file that may be replaced.
        do {
            try control.unregister(store.path, timeoutSeconds: durableTimeoutSeconds)
            state.withLock { _ = $0.unconfirmed.remove(store.path) }
        } catch {
            state.withLock { _ = $0.unconfirmed.insert(store.path) }
            if entry.registered { failed("unregister \(store.user)", error) }
        }
    }

    /// The durable time-out in Litestream's whole seconds, rounded up.
    private var durableTimeoutSeconds: Int { max(1, (settings.durableTimeoutMilliseconds + 999) / 1000) }

    func storeReplaced(_ user: UserID, path: String, deleteReplica: Bool) throws {
        // A Litestream that may still hold the old file would ship the new one's pages against
        // the old position (or bring a deleted replica back): it must confirm it let go first.
        if state.withLock({ $0.unconfirmed.contains(path) }) {
            do {
                try control.unregister(path, timeoutSeconds: durableTimeoutSeconds)
                state.withLock { _ = $0.unconfirmed.remove(path) }
            } catch {
                throw StoreError.replicationUnavailable(user: user, message: "Litestream has not confirmed it stopped replicating the store (\(error)); retry")
            }
        }
        try? FileManager.default.removeItem(atPath: Self.sidecar(of: path))
        try? FileManager.default.removeItem(atPath: Self.epochFile(of: path))
        guard deleteReplica else { return }
        let url = withSuffix(userFolderSuffix(user))
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
        let timeout = durableTimeoutSeconds
        // This sync covers every commit so far: the next sync pass need not repeat it (a commit
        // after this point sets the flag again).
        let written = store.wal.take()
        do {
            let deadline = ContinuousClock.now + .seconds(timeout)
            while true {
                let left = max(1, Int((deadline - ContinuousClock.now).components.seconds) + 1)
                let reply = try await control.syncAndWait(path, timeoutSeconds: min(timeout, left))
                // With `wait`, Litestream ships to the replica even when its local position did
                // not move (`no_change`): either way the replica's position is the proof.
                guard ["no_change", "synced"].contains(reply.status) else {
                    throw LitestreamControl.Failure(description: "sync ended \(reply.status) at txid \(reply.txid), replica at \(reply.replicatedTXID)")
                }
                if reply.replicatedTXID >= reply.txid { break }
                // A sync that raced another one for the same store (the sync pass, a second
                // durable write) can come back with the replica one transaction behind
                // (measured under the cluster harness: "synced at txid 5, replica at 4"): ask
                // again, within the same time limit.
                guard ContinuousClock.now < deadline else {
                    throw LitestreamControl.Failure(description: "sync ended \(reply.status) at txid \(reply.txid), replica at \(reply.replicatedTXID), and did not catch up within \(timeout) s")
                }
                try await Task.sleep(for: .milliseconds(10)) // let the other sync finish before asking again
            }
        } catch {
            if written { store.wal.restore() }
            failed("sync \(user)", error)
            throw StoreError.replicationUnavailable(user: user, message: "\(error)")
        }
    }

    /// Syncs every registered store written since the last pass to the replica, waiting for
    /// each, at most 64 at a time (with many written stores the pass itself must end well within
    /// the interval). Run every quarter of ``ReplicationSettings/syncIntervalMilliseconds`` by
    /// ``ReplicationMonitor``, so that a write acknowledged one interval ago is in the replica
    /// (Litestream's own loops alone took up to 1.3 s with its fixed 1 s interval: a local pass,
    /// then an upload pass, each on its own ticker).
    func syncWrittenStores() async {
        let written = state.withLock { state in
            state.open.values.filter { $0.registered && $0.store.wal.take() }.map(\.store)
        }
        let timeout = durableTimeoutSeconds
        let control = self.control
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            for store in written {
                if running == 64 {
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
                        store.wal.restore()
                        self.failed("sync \(store.user)", error)
                    }
                }
            }
        }
    }

    // MARK: Health

    /// What `Status` and `userstorectl replication` show.
    struct Snapshot: Sendable {
        var registered: Int
        var unregistered: Int
        var lastError: String?
        var litestreamPID: Int
        var litestreamVersion: String
        var restored: Int
        /// Per open store: its user, whether it is registered, its last sync.
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
                            lastError: state.lastError, litestreamPID: state.litestreamPID,
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
            // Nobody else checkpoints them until they are registered again.
            for store in lost { store.wal.checkpointsItself = true }
            failed("health check", error)
            return
        }
        let replicating = Set(listed.filter { $0.status == "replicating" }.map(\.path))
        // Stores Litestream replicates that the daemon had marked unregistered (a failed check
        // or a register that timed out after it took effect) are registered again as they are.
        let (missing, regained) = state.withLock { state -> ([Store], [Store]) in
            for database in listed { state.lastSync[database.path] = database.lastSyncAt }
            var regained: [Store] = []
            for (path, entry) in state.open where !entry.registered && replicating.contains(path) {
                state.open[path]!.registered = true
                regained.append(entry.store)
            }
            return (state.open.values.filter { !replicating.contains($0.store.path) }.map(\.store), regained)
        }
        for store in regained { store.wal.checkpointsItself = false }
        var allRegistered = true
        for store in missing where !register(store) { allRegistered = false }
        // What they wrote while unregistered is synced by the next pass.
        for store in regained + missing where isRegistered(store) { store.wal.restore() }
        if allRegistered { recovered() }
    }

    // MARK: Helpers

    private func isRegistered(_ store: Store) -> Bool {
        state.withLock { $0.open[store.path].map { $0.store === store && $0.registered } ?? false }
    }

    /// Registers `store` with Litestream; on failure the store checkpoints itself until a
    /// later ``reconcile()`` registers it.
    private func register(_ store: Store) -> Bool {
        // Before Litestream looks at the WAL: a checkpoint of ours must not race its first sync.
        store.wal.checkpointsItself = false
        do {
            let url = replicaURL(for: store.user)
            if let epoch = url.range(of: "/e", options: .backwards).map({ url[$0.upperBound...] }), fencing != nil {
                // Before anything is written under this epoch (DurableFile: it must survive a crash).
                try DurableFile.write(String(epoch), to: Self.epochFile(of: store.path))
                state.withLock { $0.epochs[store.path] = Int64(epoch) }
            }
            try control.register(store.path, replicaURL: url)
            let stillOpen = state.withLock { state -> Bool in
                guard state.open[store.path]?.store === store else { return false }
                state.open[store.path]!.registered = true
                return true
            }
            // Closed while ``reconcile()`` registered it again: Litestream must not keep it.
            if !stillOpen { try? control.unregister(store.path) }
            return true
        } catch {
            store.wal.checkpointsItself = true
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
    ///
    /// Spawned with posix_spawn and reaped with waitpid, not Foundation's Process: a restore
    /// once waited out its whole time-out inside the full test suite with Process, whose exit
    /// notice goes through a shared SIGCHLD monitor. Output goes to a temporary file, not a
    /// pipe (a pipe's write end inherited by a process started at the same moment would keep
    /// the read from ending); signals are reset to their defaults and unblocked in the child.
    /// A run longer than the time-out is killed.
    private func run(_ arguments: [String], user: UserID) throws -> (Int32, String) {
        let outputPath = NSTemporaryDirectory() + "userstored-litestream-\(UUID().uuidString).log"
        let output = open(outputPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard output >= 0 else {
            throw StoreError.replicationUnavailable(user: user, message: "cannot create \(outputPath) for litestream's output: \(String(cString: strerror(errno)))")
        }
        defer {
            close(output)
            unlink(outputPath)
        }
        let executable = Self.resolve(settings.litestream)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, output, 1)
        posix_spawn_file_actions_adddup2(&actions, output, 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), all = sigset_t()
        sigemptyset(&none)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        guard spawned == 0 else {
            throw StoreError.replicationUnavailable(user: user, message: "cannot run \(executable): \(String(cString: strerror(spawned)))")
        }
        let limit = max(30, durableTimeoutSeconds * 6)
        let deadline = ContinuousClock.now + .seconds(limit)
        var status: Int32 = 0
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { break }
            if reaped < 0 && errno != EINTR {
                throw StoreError.replicationUnavailable(user: user, message: "waiting for litestream: \(String(cString: strerror(errno)))")
            }
            if ContinuousClock.now > deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                throw StoreError.replicationUnavailable(user: user, message: "litestream \(arguments.first ?? "") did not finish within \(limit) s")
            }
            usleep(1_000)
        }
        let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
        // WIFEXITED / WEXITSTATUS are macros: exit status in bits 8-15 when the low 7 bits are 0.
        return ((status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F), text)
    }

    /// `name` found in `$PATH` (posix_spawn and Process need a path), or `name` itself.
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
        // Not "decode" alone: Litestream wraps transport errors as "decode database: …" too.
        // Format errors name what was wrong with the data (a page header, a checksum, lz4).
        return ["integrity", "checksum", "corrupt", "malformed", "decompress", "invalid ltx", "invalid page", "magic"].contains { lowered.contains($0) }
    }
}

/// Epoch-fenced replica paths, with more than one host (docs/cluster.md): each owner of a
/// bucket replicates its users under the bucket's epoch, so a host that lost the bucket (and
/// may still ship what it had) writes where the next owner never reads after its first write.
protocol ReplicaFencing: Sendable {
    /// `user`'s bucket.
    func bucket(of user: UserID) -> Int
    /// The epoch of `user`'s bucket as this host sees it (nil: no owner record seen).
    func epoch(of user: UserID) -> Int64?
}
