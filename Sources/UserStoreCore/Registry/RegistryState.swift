/// A store as the registry's state sees it: ``Store``, or a stand-in in the state's tests,
/// which run without SQLite.
protocol RegistryStore: AnyObject, Sendable {
    /// Why SQLite found the store damaged while serving, if it did.
    var damaged: String? { get }
}

extension Store: RegistryStore {}

/// What preparing a store (opening and/or migrating it, in a task of its own) came to.
enum PreparationOutcome: Sendable {
    /// The store is open; its phase says whether it is ready or failed. Carries what the
    /// migration run did, if one ran.
    case prepared(MigrationReport?)
    /// Migrated and closed again (a fleet run's `closeAfter`): the entry is gone.
    case closed(MigrationReport)
    /// The file could not be opened at all; the entry is gone.
    case openFailed(StoreError)
}

/// The registry's state and every transition of it — which store a request gets, which one is
/// opened, migrated, evicted or refused — as a pure value, without files or SQLite: the
/// ``StoreRegistry`` holds it under its mutex and carries out what a transition asks for
/// (`RegistryStateTests` drive it directly).
struct RegistryState<S: RegistryStore>: ~Copyable {
    var entries: [UserID: RegistryEntry<S>] = [:]
    var migrations: MigrationSet
    var generation = 0
    /// Files open, being opened or being closed: what `maxOpenStores` bounds.
    var holding = 0
    var peak = 0
    var tick: UInt64 = 0
    var migrationRuns = 0
    var capacityWaiters: [CheckedContinuation<Void, Never>] = []
    /// Users whose store was taken out to be closed (idle, evicted, closed after a fleet job's
    /// look) and is not closed yet, with the requests waiting for that: a request never opens
    /// a second connection beside the closing one (it waited for SQLite's lock and failed with
    /// "database is locked" when the close outlasted the busy time-out — a close waits for the
    /// replica, up to the durable time-out, when the replica is down).
    var closing: [UserID: [CheckedContinuation<Void, Never>]] = [:]
    /// The new-store template, when built for the current generation.
    var template: StoreTemplate?
    /// The generation a template build was last started for (built or failed).
    var templateAttempted: Int?
    /// Why stores that were found damaged — by SQLite while serving, or by a fleet run's failed
    /// shared sync — were, once they were closed: opened again, a connection would serve what
    /// the kernel's cache holds as if it were sound. They stay refused (to clients, and to
    /// migrations) until the daemon restarts or the store is replaced (delete, import, restore).
    var damaged: [UserID: String] = [:]
    /// The limits and policies the transitions follow.
    var rules: Rules

    init(migrations: MigrationSet, rules: Rules) {
        self.migrations = migrations
        self.rules = rules
    }

    // MARK: Leasing

    /// The limits and policies the transitions follow.
    struct Rules {
        var maxOpenStores: Int
        /// A store whose migration failed is still served, at its old version
        /// (``MigrationPolicy/servePreviousVersionOnFailure``).
        var servePreviousVersionOnFailure: Bool
    }

    /// What a request for a store does next.
    enum LeaseStep {
        /// Use this store (leased now); with the failure an administrator gets it despite.
        case use(S, StoreError?)
        /// Wait for the store's preparation, then ask again.
        case wait(Task<PreparationOutcome, Never>)
        /// Close this idle store (taken out already) to make room, then ask again.
        case evict(S)
        /// Every open store is in use: wait for a release, then ask again.
        case waitForCapacity
        /// The user's store is being closed: wait for that (``closed(_:)``), then ask again.
        case waitForClose
        case fail(StoreError)
    }

    /// A preparation the caller starts for a transition, as a task (which ends with the
    /// matching `prepared`, `preparedAndClosed` or `openFailed`).
    enum Preparation {
        /// Bring this open store (opened under older migrations) up to date.
        case bringUpToDate(S)
        /// Open the file (creating it, and migrating it, with `migrate`); the slot is counted.
        case open(migrate: Bool)
    }

    /// The next step of a request for `user`'s store. `exists`: whether its file exists (read
    /// only for ``StoreRegistry/LeaseMode/asIs``). `refused` hears of a store refused just now;
    /// `prepare` starts a preparation.
    mutating func nextStep(for user: UserID, access: StoreRegistry.Access, mode: StoreRegistry.LeaseMode, exists: Bool,
                           refused: (StoreError) -> Void,
                           prepare: (inout Self, Preparation) -> Task<PreparationOutcome, Never>) -> LeaseStep {
        tick += 1
        if var entry = entries[user] {
            switch entry.phase {
            case .preparing(let task):
                return .wait(task)
            case .ready where mode == .asIs, .failed where mode == .asIs:
                return use(&entry, user, failure: nil)
            case .ready(let generation) where generation == self.generation && entry.store?.damaged != nil && mode == .migrate:
                // Found damaged while serving: refused to clients from now on, left as it is.
                let failure = StoreError.storeDamaged(user: user, message: entry.store!.damaged!)
                entry.phase = .failed(failure, generation)
                entries[user] = entry
                refused(failure)
                guard access == .admin else { return .fail(failure) }
                return use(&entry, user, failure: failure)
            case .ready(let generation) where generation == self.generation:
                return use(&entry, user, failure: nil)
            case .failed(let error, let generation) where generation == self.generation:
                let servable: Bool
                if case .migrationFailed = error { servable = rules.servePreviousVersionOnFailure } else { servable = false }
                guard access == .admin || servable else { return .fail(error) }
                return use(&entry, user, failure: error)
            default:
                // Opened as it is by an administrator although found damaged before: not migrated, not served.
                if let damage = entry.store?.damaged ?? damaged[user] {
                    return .fail(.storeDamaged(user: user, message: damage))
                }
                // Opened under an older migration set: bring it up to date before use.
                let task = prepare(&self, .bringUpToDate(entry.store!))
                entry.phase = .preparing(task)
                entries[user] = entry
                return .wait(task)
            }
        }
        if closing[user] != nil { return .waitForClose }
        if mode == .asIs && !exists { return .fail(.noSuchStore(user: user)) }
        // Found damaged and closed since: an administrator may still open it as it is (verify,
        // snapshot), nobody may serve or migrate it.
        if let damage = damaged[user], access != .admin || mode == .migrate {
            return .fail(.storeDamaged(user: user, message: damage))
        }
        if hasRoom {
            return .wait(startOpening(user, prepare(&self, .open(migrate: mode == .migrate))))
        }
        if let victim = idleVictim() {
            return .evict(takeOutForClosing(victim)!.store!)
        }
        return .waitForCapacity
    }

    private mutating func use(_ entry: inout RegistryEntry<S>, _ user: UserID, failure: StoreError?) -> LeaseStep {
        entry.lease(tick: tick)
        entries[user] = entry
        return .use(entry.store!, failure)
    }

    /// One more store may be opened without closing another.
    var hasRoom: Bool { holding < rules.maxOpenStores }

    /// The task opening or migrating `user`'s store now, if any.
    func preparation(of user: UserID) -> Task<PreparationOutcome, Never>? {
        entries[user]?.preparation
    }

    /// A request that waits for capacity may ask again: there is room, or an idle store to evict.
    var hasCapacity: Bool { hasRoom || idleVictim() != nil }

    /// Counts a store being opened for `user` (who has no entry; there is room) and enters it
    /// as being prepared by `task`, so that requests for it wait for the task.
    mutating func startOpening(_ user: UserID, _ task: Task<PreparationOutcome, Never>) -> Task<PreparationOutcome, Never> {
        holding += 1
        peak = max(peak, holding)
        entries[user] = RegistryEntry(store: nil, phase: .preparing(task), tick: tick)
        return task
    }

    /// `user`'s store, leased, when it is ready under the current generation and not found
    /// damaged; nil (nothing changed) otherwise. The event loops' fast path: one probe, and the
    /// entry changed in place (reading `entries.values[index]` would copy it, retaining all it holds).
    mutating func leaseIfReady(_ user: UserID) -> S? {
        guard let index = entries.index(forKey: user) else { return nil }
        let store = entries.values[index].leaseIfReady(generation: generation, tick: tick &+ 1)
        if store != nil { tick &+= 1 }
        return store
    }

    /// Ends a lease; returns who waited for the last one to end.
    mutating func release(_ user: UserID) -> [CheckedContinuation<Void, Never>] {
        guard let index = entries.index(forKey: user) else { return [] }
        guard let drainWaiters = entries.values[index].release() else { return [] }
        if !capacityWaiters.isEmpty { wakeWaiters() }
        return drainWaiters
    }

    // MARK: Ends of preparations

    /// A preparation left `store` open in `phase`.
    mutating func prepared(_ user: UserID, store: S, phase: RegistryEntry<S>.Phase, migrated: Bool) {
        guard var entry = entries[user] else { return }
        entry.store = store
        entry.phase = phase
        entry.lastUsed = .now
        if migrated { migrationRuns += 1 }
        entries[user] = entry
    }

    /// A preparation migrated the store and closed it again; or could not open it. Either way
    /// the slot is free.
    mutating func preparationClosed(_ user: UserID, migrated: Bool) {
        if migrated { migrationRuns += 1 }
        entries[user] = nil
        freeSlots(1)
    }

    /// Takes `user`'s entry out so that its store can be closed by the caller, who then calls
    /// ``closed(_:)``; requests for the user wait until then.
    @discardableResult
    mutating func takeOutForClosing(_ user: UserID) -> RegistryEntry<S>? {
        guard let entry = removeForClosing(user) else { return nil }
        closing[user] = []
        return entry
    }

    /// `user`'s store, taken out with ``takeOutForClosing(_:)``, is closed: its slot is free,
    /// and the requests waiting for it ask again.
    mutating func closed(_ user: UserID) {
        for waiter in closing.removeValue(forKey: user) ?? [] { waiter.resume() }
        freeSlots(1)
    }

    /// Adds `waiter` to those waiting for `user`'s store to be closed; false (not added) when
    /// it is not being closed.
    mutating func waitForClose(of user: UserID, _ waiter: CheckedContinuation<Void, Never>) -> Bool {
        guard closing[user] != nil else { return false }
        closing[user]!.append(waiter)
        return true
    }

    /// `count` stores were closed: their slots are free.
    mutating func freeSlots(_ count: Int) {
        holding -= count
        wakeWaiters()
    }

    // MARK: Eviction

    /// The least recently used store that nobody holds and that is not being prepared.
    /// Reads the entries in place through their index: iterating `(user, entry)` pairs copied
    /// every entry (a retain of its store and task each), which was 5% of a fleet migration's
    /// CPU with 1,024 stores open.
    func idleVictim() -> UserID? {
        var best: Dictionary<UserID, RegistryEntry<S>>.Index?
        var bestTick = UInt64.max
        var index = entries.startIndex
        while index != entries.endIndex {
            if entries.values[index].tick < bestTick, entries.values[index].isIdle {
                bestTick = entries.values[index].tick
                best = index
            }
            entries.formIndex(after: &index)
        }
        return best.map { entries.keys[$0] }
    }

    /// Takes `user`'s entry out so that its store can be closed, remembering the store's
    /// damage, if any (``damaged``). Every path that closes a store it removes goes through here.
    @discardableResult
    mutating func removeForClosing(_ user: UserID) -> RegistryEntry<S>? {
        let entry = entries.removeValue(forKey: user)
        if let damage = entry?.store?.damaged { damaged[user] = damage }
        return entry
    }

    /// Lets every request waiting for capacity look again.
    mutating func wakeWaiters() {
        let waiters = capacityWaiters
        capacityWaiters.removeAll()
        for waiter in waiters { waiter.resume() }
    }

    var statistics: RegistryStatistics {
        var preparing = 0, failed = 0, leases = 0
        for entry in entries.values {
            leases += entry.leases
            switch entry.phase {
            case .preparing: preparing += 1
            case .failed: failed += 1
            case .ready: break
            }
        }
        return RegistryStatistics(openStores: holding, peakOpenStores: peak, preparing: preparing, failedStores: failed,
                                  leases: leases, migrationRuns: migrationRuns, generation: generation)
    }
}

/// One user's slot in the registry.
struct RegistryEntry<S: RegistryStore> {
    enum Phase {
        /// Being opened and/or migrated; requests wait for the task.
        case preparing(Task<PreparationOutcome, Never>)
        /// Up to date with the migration set of that generation.
        case ready(Int)
        /// Open, but its migration failed or it was refused, under that generation.
        case failed(StoreError, Int)
    }

    var store: S?
    var phase: Phase
    var leases = 0
    /// LRU order.
    var tick: UInt64
    var lastUsed: ContinuousClock.Instant = .now
    /// Who waits for the last lease to end (``StoreRegistry/withStoreClosed(_:replacingFiles:_:)``).
    var drainWaiters: [CheckedContinuation<Void, Never>] = []

    init(store: S?, phase: Phase, tick: UInt64) {
        self.store = store
        self.phase = phase
        self.tick = tick
    }

    /// The task opening or migrating the store now, if any.
    var preparation: Task<PreparationOutcome, Never>? {
        guard case .preparing(let task) = phase else { return nil }
        return task
    }

    /// Open, held by nobody and not being prepared: may be closed.
    var isIdle: Bool {
        guard leases == 0, store != nil else { return false }
        if case .preparing = phase { return false }
        return true
    }

    /// `lastUsed` is set when the lease ends: only idle entries are judged by it.
    mutating func lease(tick: UInt64) {
        leases += 1
        self.tick = tick
    }

    /// Leases the store if it is ready under `generation` and not found damaged.
    mutating func leaseIfReady(generation current: Int, tick: UInt64) -> S? {
        guard case .ready(let generation) = phase, generation == current,
              let store, store.damaged == nil else { return nil }
        lease(tick: tick)
        return store
    }

    /// Ends a lease. When it was the last: who waited for that (taken out), else nil.
    mutating func release() -> [CheckedContinuation<Void, Never>]? {
        leases -= 1
        lastUsed = .now
        guard leases == 0 else { return nil }
        defer { drainWaiters = [] }
        return drainWaiters
    }
}
