import Foundation
import GRDB
import Synchronization

/// The open stores of one data directory: one connection per file, opened and migrated lazily
/// and exactly once, at most `maxOpenStores` at a time.
///
/// - The first request for a user opens (or creates) the file and migrates it; concurrent
///   requests for the same user wait for that one preparation instead of starting their own.
/// - Different users are opened and migrated in parallel.
/// - When the limit is reached the least recently used idle store is closed first; if every
///   open store is busy, the request waits until one is released.
/// - A store is never closed while a request holds it (``withStore(_:access:_:)``).
/// - ``reload(migrations:)`` bumps a generation: every open store is brought up to date on its
///   next use, and stores whose migration failed are retried.
///
/// Holding a ``DataDirectoryLock`` is a precondition: no other process opens these files.
public final class StoreRegistry: Sendable {
    /// Who is asking: ordinary clients get ``StoreError``s for failed or refused stores;
    /// administrators get the store as it is, so they can inspect or repair it.
    public enum Access: Sendable { case client, admin }

    /// The configuration this registry was built with.
    public let configuration: RegistryConfiguration
    let observer: any StoreObserver
    /// The off-host copy of every store, when replication is on.
    public let replication: (any StoreReplication)?
    /// Which users this daemon may serve (more than one host); nil: all of them.
    public let placement: (any StorePlacement)?
    private let lock: DataDirectoryLock
    /// The file work of opening, migrating and closing stores.
    let preparer: StorePreparer
    let state: Mutex<RegistryState<Store>>

    /// A registry over `configuration.layout`, which `lock` must be the lock of.
    /// With `replication`, every store is restored from the replica when it is missing here,
    /// replicated while it is open, and its replica follows deletions and replacements. With
    /// `placement`, only the users it admits are served.
    /// With `gate`, a store is migrated only to the versions the gate allows it (a staged release).
    public convenience init(configuration: RegistryConfiguration, migrations: MigrationSet, lock: DataDirectoryLock,
                observer: any StoreObserver = NoStoreObserver(), replication: (any StoreReplication)? = nil,
                placement: (any StorePlacement)? = nil, gate: (any MigrationGate)? = nil) {
        self.init(configuration: configuration, migrations: migrations, lock: lock, observer: observer,
                  replication: replication, placement: placement, fleetSync: nil, gate: gate)
    }

    /// As above; `fleetSync`: the group commit of fleet runs (tests pass one that fails).
    init(configuration: RegistryConfiguration, migrations: MigrationSet, lock: DataDirectoryLock,
         observer: any StoreObserver, replication: (any StoreReplication)?, placement: (any StorePlacement)?,
         fleetSync: FileSystemSync?, gate: (any MigrationGate)? = nil) {
        precondition(lock.path == configuration.layout.lockPath, "the lock must be the data directory's own")
        self.configuration = configuration
        self.placement = placement
        self.observer = observer
        self.replication = replication
        self.lock = lock
        var opener = StoreOpener(layout: configuration.layout, busyTimeoutSeconds: configuration.busyTimeoutSeconds)
        opener.replicated = replication != nil
        opener.changeRetention = configuration.changeRetention
        opener.keyring = configuration.keyring
        preparer = StorePreparer(configuration: configuration, opener: opener, observer: observer, replication: replication,
                                 fleetSync: fleetSync ?? FileSystemSync(directory: configuration.layout.dataDirectory), gate: gate)
        self.state = Mutex(RegistryState(migrations: migrations, rules: .init(
            maxOpenStores: configuration.maxOpenStores, servePreviousVersionOnFailure: configuration.policy.servePreviousVersionOnFailure)))
    }

    /// The migrations in force.
    public var migrations: MigrationSet { state.withLock { $0.migrations } }

    /// Current counters.
    public var statistics: RegistryStatistics { state.withLock { $0.statistics } }

    /// Runs `body` with `user`'s store, opening and migrating it first if needed. The store
    /// stays open (and is not evicted) until `body` returns.
    ///
    /// Throws ``StoreError``: `.invalidUser` never reaches here (``UserID`` is valid by
    /// construction); `.migrationFailed`, `.storeTooNew`, `.checksumMismatch`,
    /// `.outOfOrderMigration`, `.storeDamaged` or `.storageFailure` for client access to a
    /// store that cannot be served.
    public func withStore<T>(_ user: UserID, access: Access = .client, _ body: (Store) async throws -> T) async throws -> T {
        let lease = try await acquire(user, access: access, mode: .migrate)
        defer { release(user) }
        return try await body(lease.store)
    }

    /// Like ``withStore(_:access:_:)``, also saying what opening the store did (nil when it
    /// was already open and current).
    public func withStore<T>(_ user: UserID, access: Access = .client, reporting body: (Store, MigrationReport?) async throws -> T) async throws -> T {
        let lease = try await acquire(user, access: access, mode: .migrate)
        defer { release(user) }
        return try await body(lease.store, lease.report)
    }

    /// `user`'s store, opened and migrated like for any request, leased until ``release(_:)``
    /// (an interactive transaction holds its store this way across calls).
    public func lease(_ user: UserID) async throws -> Store {
        try await acquire(user, access: .client, mode: .migrate).store
    }

    /// Runs `body` with `user`'s store as it is — opened if needed, but neither created nor
    /// migrated (a later request migrates it as usual) — for operators' reads such as `Plan`,
    /// which must go through the one connection the daemon keeps per file. Throws
    /// ``StoreError/noSuchStore(user:)`` when the user has no store.
    public func withExistingStore<T>(_ user: UserID, _ body: (Store) async throws -> T) async throws -> T {
        _ = try await acquire(user, access: .admin, mode: .asIs)
        defer { release(user) }
        return try await body(state.withLock { $0.entries[user]!.store! })
    }

    /// `user`'s store, leased, when it is open and up to date — or nil, without waiting, when a
    /// request must go through ``withStore(_:access:_:)`` (not open, being prepared, failed,
    /// opened under older migrations). The lease keeps the store open until ``release(_:)``.
    ///
    /// The event loops' fast path: one lock and one dictionary probe.
    public func leaseIfReady(_ user: UserID) -> Store? {
        // Refused here: the slow path throws the reason.
        if let placement { do { try placement.admit(user) } catch { return nil } }
        return state.withLock { $0.leaseIfReady(user) }
    }

    /// The recorded versions of `user`'s store (opening and migrating it like any request).
    public func info(_ user: UserID, access: Access = .client) async throws -> StoreVersionInfo {
        try await withStore(user, access: access) { try await $0.versionInfo() }
    }

    // MARK: Leasing

    struct Lease {
        let store: Store
        let report: MigrationReport?
        /// Why the store is failed or refused (only admin access gets such a store).
        let failure: StoreError?
        /// A preparation ran for this lease (the failure, if any, is from it, just now).
        var preparedNow = false
    }

    /// What a lease does to the store first: bring it up to date (every request), or nothing
    /// (``withExistingStore(_:_:)``: open an existing file as it is).
    enum LeaseMode { case migrate, asIs }

    func acquire(_ user: UserID, access: Access, mode: LeaseMode) async throws(StoreError) -> Lease {
        var report: MigrationReport?
        var preparedNow = false
        while true {
            // Asked again after every wait: the user's bucket may have started moving meanwhile.
            try placement?.admit(user)
            let exists = mode == .asIs ? FileManager.default.fileExists(atPath: configuration.layout.storePath(for: user)) : true
            let step = state.withLock { state in
                state.nextStep(for: user, access: access, mode: mode, exists: exists, refused: { failure in
                    observer.record(.storeRefused(user: user, error: failure))
                }, prepare: { state, preparation in
                    self.preparation(&state, user, preparation)
                })
            }
            switch step {
            case .use(let store, let failure):
                return Lease(store: store, report: report, failure: failure, preparedNow: preparedNow)
            case .wait(let task):
                switch await task.value {
                case .prepared(let outcome):
                    preparedNow = true
                    // After a fleet run's job (below) the store is opened again with nothing
                    // left to apply: the job's report is the one that says what happened.
                    if let outcome, report == nil || outcome.migrated { report = outcome }
                case .closed(let outcome):
                    report = outcome
                case .openFailed(let error): throw error
                }
            case .evict(let store):
                observer.record(.storeClosed(user: store.user, idle: false))
                await preparer.close(store)
                state.withLock { state in state.closed(store.user) }
            case .waitForClose:
                await waitForClose(of: user)
            case .waitForCapacity:
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { state in
                        if state.hasCapacity { return true }
                        state.capacityWaiters.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            case .fail(let error):
                throw error
            }
        }
    }

    /// Starts `preparation` of `user`'s store in a task of its own. `closeAfter`: see ``prepare``.
    func preparation(_ state: inout RegistryState<Store>, _ user: UserID, _ preparation: RegistryState<Store>.Preparation,
                     closeAfter: Bool = false) -> Task<PreparationOutcome, Never> {
        switch preparation {
        case .bringUpToDate(let store):
            return prepare(user, existing: store, generation: state.generation, migrations: state.migrations)
        case .open(migrate: true):
            // A store a staged release holds back is created at the versions before it, step by step.
            let template = preparer.gate?.allowedVersions(for: user) == nil ? templateForNewStore(&state) : nil
            return prepare(user, existing: nil, generation: state.generation, migrations: state.migrations,
                           template: template, closeAfter: closeAfter)
        case .open(migrate: false):
            return prepare(user, existing: nil, generation: -1, migrations: state.migrations, migrate: false)
        }
    }

    /// Ends a lease taken by ``leaseIfReady(_:)`` (``withStore(_:access:_:)`` ends its own).
    public func release(_ user: UserID) {
        for waiter in state.withLock({ $0.release(user) }) { waiter.resume() }
    }

    // MARK: Preparing

    /// Opens (if `existing` is nil) and migrates `user`'s store in a task of its own, so that a
    /// client that disconnects never cancels a migration half-way. Without `migrate`, only opens
    /// an existing file (the entry is then stale: the next request migrates it). With
    /// `closeAfter` (a fleet run's store that was not open), a store whose migration succeeds
    /// is closed (in the same job, or after it once the log has a replicated store's last
    /// commits) and its entry removed; requests that waited open it again.
    private func prepare(_ user: UserID, existing: Store?, generation: Int, migrations: MigrationSet,
                         template: StoreTemplate? = nil, migrate: Bool = true, closeAfter: Bool = false) -> Task<PreparationOutcome, Never> {
        Task {
            let migrator = preparer.makeMigrator(user, migrations: migrations, durability: closeAfter ? preparer.fleetDurability(for: user) : .lastCommit)
            let store: Store
            let migration: Result<MigrationReport?, any Error>
            var closed = false
            if let existing {
                store = existing
                do {
                    migration = .success(try await existing.write { db in existing.migrated(try migrator.migrate(db, created: false)) })
                } catch {
                    migration = .failure(error)
                }
            } else {
                switch await preparer.openAndMigrate(user, template: template, migrator: migrate ? migrator : nil, closeAfter: closeAfter) {
                case .success(let opened):
                    (store, migration, closed) = opened
                case .failure(let failure):
                    observer.record(.storeRefused(user: user, error: failure))
                    state.withLock { state in state.preparationClosed(user, migrated: false) }
                    return .openFailed(failure)
                }
            }
            if closed, case .success(let report?) = migration {
                state.withLock { state in state.preparationClosed(user, migrated: report.migrated) }
                return .closed(report)
            }
            let phase: RegistryEntry<Store>.Phase
            var report: MigrationReport?
            switch migration {
            case .success(let outcome):
                report = outcome
                phase = .ready(generation)
            case .failure(let error):
                let failure = StoreError.from(error, user: user)
                if case .migrationFailed = failure {} else { observer.record(.storeRefused(user: user, error: failure)) }
                phase = .failed(failure, generation)
            }
            state.withLock { state in state.prepared(user, store: store, phase: phase, migrated: report?.migrated == true) }
            return .prepared(report)
        }
    }

    // MARK: Template

    /// The template for the current generation if new stores are to be copied from one and it
    /// is built; otherwise nil, and a build is started if none was for this generation
    /// (meanwhile new stores are migrated step by step).
    private func templateForNewStore(_ state: inout RegistryState<Store>) -> StoreTemplate? {
        guard configuration.policy.newStoresFromTemplate else { return nil }
        if let template = state.template, template.generation == state.generation { return template }
        if state.templateAttempted != state.generation {
            state.templateAttempted = state.generation
            Task { try? await buildTemplate() }
        }
        return nil
    }

    /// Builds the new-store template for the migrations in force (when
    /// ``MigrationPolicy/newStoresFromTemplate`` is set; otherwise does nothing). Throws what
    /// migrating an empty store throws; new stores are then migrated step by step, and fail
    /// the same way.
    public func buildTemplate() async throws {
        guard configuration.policy.newStoresFromTemplate else { return }
        let (generation, migrations) = state.withLock { state in
            state.templateAttempted = state.generation
            return (state.generation, state.migrations)
        }
        let migrator = preparer.makeMigrator(try UserID("template"), migrations: migrations, simulating: true)
        let layout = configuration.layout
        let template = try await BlockingPool.run { try StoreTemplate.build(generation: generation, migrator: migrator, layout: layout) }
        state.withLock { state in
            if state.generation == generation { state.template = template }
        }
    }

    /// Marks `user`'s open store as needing a fresh preparation on its next use, or records
    /// the outcome of an explicit migration run.
    func setPhase(_ user: UserID, ready: Bool, failure: StoreError? = nil, stale: Bool = false) {
        state.withLock { state in
            guard var entry = state.entries[user], entry.store != nil else { return }
            if case .preparing = entry.phase { return }
            if stale {
                entry.phase = .ready(-1)
            } else if let failure {
                entry.phase = .failed(failure, state.generation)
            } else if ready {
                entry.phase = .ready(state.generation)
            }
            state.entries[user] = entry
        }
    }

    // MARK: Reload, idle, shutdown

    /// Replaces the migration set. Open stores are migrated on their next use; stores whose
    /// migration failed are retried then.
    public func reload(migrations: MigrationSet) {
        state.withLock { state in
            state.migrations = migrations
            state.generation += 1
        }
    }

    /// Has every open store checked against the migrations and the gate again on its next
    /// use (a staged release moved to another step, halted, resumed or aborted); stores whose
    /// migration failed are retried then.
    public func reconsiderStores() {
        state.withLock { state in state.generation += 1 }
    }

    /// Whether a store whose migration failed is served at the version it has (as
    /// `migrations.onFailure: serve-previous` does) — on while a staged release is in force.
    public func setServesFailedStores(_ serves: Bool) {
        state.withLock { state in
            state.rules.servePreviousVersionOnFailure = configuration.policy.servePreviousVersionOnFailure || serves
        }
    }

    /// Closes stores nobody used for ``RegistryConfiguration/idleTimeout`` (as of `now`).
    /// Stores whose migration failed stay open, so their failure is remembered.
    /// Returns how many were closed.
    @discardableResult
    public func closeIdleStores(now: ContinuousClock.Instant = .now) async -> Int {
        let idleTimeout = configuration.idleTimeout
        func expired(_ entry: RegistryEntry<Store>) -> Bool {
            guard entry.isIdle, case .ready = entry.phase else { return false }
            return entry.lastUsed + idleTimeout <= now
        }
        let users = state.withLock { state in state.entries.filter { expired($0.value) }.map(\.key) }
        var closed = 0
        // One at a time, each taken out only when its turn comes: a close may wait for the
        // replica (up to the durable time-out when it is slow), and a request for a store still
        // waiting its turn is served meanwhile instead of waiting for every close before it.
        for user in users {
            let store: Store? = state.withLock { state in
                guard let entry = state.entries[user], expired(entry) else { return nil }
                return state.takeOutForClosing(user)?.store
            }
            guard let store else { continue }
            observer.record(.storeClosed(user: user, idle: true))
            await preparer.close(store)
            state.withLock { state in state.closed(user) }
            closed += 1
        }
        return closed
    }

    /// Hands back the page caches of the open stores nobody used for `idleFor` (as of `now`):
    /// a daemon that keeps `maxOpenStores` stores open, most of them touched once in a while,
    /// then holds what its busy stores use rather than every store's last pages. A store in use
    /// right now is skipped. Blocking (SQLite frees memory): on the blocking pool. Returns how
    /// many stores gave back memory and how many bytes their caches held before and after.
    @discardableResult
    public func releaseIdleMemory(idleFor: Duration, now: ContinuousClock.Instant = .now) -> (stores: Int, before: Int, after: Int) {
        let idle: [Store] = state.withLock { state in
            state.entries.values.compactMap { entry in
                guard entry.isIdle, case .ready = entry.phase, entry.lastUsed + idleFor <= now else { return nil }
                return entry.store
            }
        }
        var released = (stores: 0, before: 0, after: 0)
        for store in idle {
            guard let cache = store.releaseMemoryIfIdle(), cache.before > cache.after else { continue }
            released.stores += 1
            released.before += cache.before
            released.after += cache.after
        }
        return released
    }

    /// Waits for every request and preparation in flight, then closes every store.
    public func shutdown() async {
        // Taken under the lock that shows no preparation or close under way: a store that a
        // close for its files (a bucket released meanwhile) holds is never taken here too.
        var stores: [Store] = []
        while true {
            let busy = state.withLock { state -> (tasks: [Task<PreparationOutcome, Never>], closing: [UserID])? in
                let tasks = state.entries.values.compactMap(\.preparation)
                guard tasks.isEmpty, state.closing.isEmpty else { return (tasks, Array(state.closing.keys)) }
                stores = state.entries.values.compactMap(\.store)
                state.entries.removeAll()
                return nil
            }
            guard let busy else { break }
            for task in busy.tasks { _ = await task.value }
            // Stores being closed already (idle, evicted): closed before the replication stops.
            for user in busy.closing { await waitForClose(of: user) }
        }
        await Self.closingSeveral(stores) { [preparer] store in
            await preparer.close(store)
            return true
        }
        state.withLock { state in state.freeSlots(stores.count) }
    }

    // MARK: Helpers

    /// How many stores a stop, or ``closeStores(matching:)``, closes at once.
    static let closingWidth = 16
}
