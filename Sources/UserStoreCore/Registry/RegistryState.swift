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

    init(migrations: MigrationSet) {
        self.migrations = migrations
    }

    /// The least recently used store that nobody holds and that is not being prepared.
    func idleVictim() -> UserID? {
        var best: (UserID, UInt64)?
        for (user, entry) in entries where entry.leases == 0 && entry.store != nil {
            if case .preparing = entry.phase { continue }
            if best == nil || entry.tick < best!.1 { best = (user, entry.tick) }
        }
        return best?.0
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

    mutating func lease(tick: UInt64) {
        leases += 1
        self.tick = tick
        lastUsed = .now
    }
}
