/// The mutable state of a ``StoreRegistry``, always accessed under its mutex.
struct RegistryState: ~Copyable {
    var entries: [UserID: RegistryEntry] = [:]
    var migrations: MigrationSet
    var generation = 0
    /// Files open, being opened or being closed: what `maxOpenStores` bounds.
    var holding = 0
    var peak = 0
    var tick: UInt64 = 0
    var migrationRuns = 0
    var capacityWaiters: [CheckedContinuation<Void, Never>] = []
    /// The new-store template, when built for the current generation.
    var template: StoreTemplate?
    /// The generation a template build was last started for (built or failed).
    var templateAttempted: Int?
    /// Why stores that were found damaged — by SQLite while serving, or by a fleet run's failed
    /// shared sync — were, once they were closed: opened again, a connection would serve what
    /// the kernel's cache holds as if it were sound. They stay refused (to clients, and to
    /// migrations) until the daemon restarts or the store is replaced (delete, import, restore).
    var damaged: [UserID: String] = [:]

    init(migrations: MigrationSet) {
        self.migrations = migrations
    }

    /// The least recently used store that nobody holds and that is not being prepared.
    /// Reads the entries in place through their index: iterating `(user, entry)` pairs copied
    /// every entry (a retain of its store and task each), which was 5% of a fleet migration's
    /// CPU with 1,024 stores open.
    func idleVictim() -> UserID? {
        var best: Dictionary<UserID, RegistryEntry>.Index?
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
    mutating func removeForClosing(_ user: UserID) -> RegistryEntry? {
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
struct RegistryEntry {
    enum Phase {
        /// Being opened and/or migrated; requests wait for the task.
        case preparing(Task<StoreRegistry.PreparationOutcome, Never>)
        /// Up to date with the migration set of that generation.
        case ready(Int)
        /// Open, but its migration failed or it was refused, under that generation.
        case failed(StoreError, Int)
    }

    var store: Store?
    var phase: Phase
    var leases = 0
    /// LRU order.
    var tick: UInt64
    var lastUsed: ContinuousClock.Instant = .now
    /// Who waits for the last lease to end (``StoreRegistry/withStoreClosed(_:_:)``).
    var drainWaiters: [CheckedContinuation<Void, Never>] = []

    init(store: Store?, phase: Phase, tick: UInt64) {
        self.store = store
        self.phase = phase
        self.tick = tick
    }

    /// Open, held by nobody and not being prepared: may be closed.
    var isIdle: Bool {
        guard leases == 0, store != nil else { return false }
        if case .preparing = phase { return false }
        return true
    }

    mutating func lease(tick: UInt64) {
        leases += 1
        self.tick = tick
        lastUsed = .now
    }
}
