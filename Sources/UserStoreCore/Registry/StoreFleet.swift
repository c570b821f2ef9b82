/// What a fleet migration (or its dry run) did to one store.
public struct FleetOutcome: Sendable {
    public enum State: String, Sendable {
        /// Migrations (or a reconcile) ran.
        case migrated
        /// Nothing to do.
        case current
        /// Dry run: something would run.
        case planned
        case failed
        /// Left at its version on purpose: a staged release does not reach it yet (it is
        /// outside the current step's cohort, or the release is halted or aborted).
        case held
    }

    public var user: UserID
    public var state: State
    public var fromVersion: Int64?
    public var toVersion: Int64?
    /// Why the store failed.
    public var error: StoreError?
}

/// A fleet run's work on one store (``FleetRunner`` runs it over many): migrate or verify,
/// never throwing — one store's failure is part of the fleet's outcome — and close again what
/// the run opened, so that a fleet run does not push the stores clients use out of the LRU.
public struct StoreFleet: Sendable {
    let registry: StoreRegistry

    /// Migrates `user`'s store (plans it, with `dryRun`) and says how it went, never throwing:
    /// one store's failure is part of a fleet's outcome.
    public func migrate(_ user: UserID, dryRun: Bool) async -> FleetOutcome {
        do {
            if dryRun {
                let plan = try await registry.plan(user)
                let current = plan.steps.isEmpty && !plan.isNewStore && !plan.reconcile
                let state: FleetOutcome.State = !current ? .planned : plan.heldVersions.isEmpty ? .current : .held
                return FleetOutcome(user: user, state: state, fromVersion: plan.fromVersion, toVersion: plan.toVersion)
            }
            let report: MigrationReport
            if let migrated = try await migrateUnopened(user) {
                report = migrated
            } else {
                // Open already (a request holds it, or there was no room for one more).
                report = try await closingAfter(user) { try await registry.migrate(user) }
            }
            let state: FleetOutcome.State = report.migrated ? .migrated : report.heldVersions.isEmpty ? .current : .held
            return FleetOutcome(user: user, state: state, fromVersion: report.fromVersion, toVersion: report.toVersion)
        } catch {
            return FleetOutcome(user: user, state: .failed, error: StoreError.from(error, user: user))
        }
    }

    /// Runs `body` on `user`'s store, then closes the store again if it was not open before (and
    /// nobody uses it now; a store left failed stays open): a fleet-wide operation must not push
    /// the stores clients use out of the LRU (``closeUnlessUsed(_:)``).
    public func closingAfter<T>(_ user: UserID, _ body: () async throws -> T) async throws -> T {
        let wasOpen = isOpen(user)
        let result: Result<T, any Error>
        do { result = .success(try await body()) } catch { result = .failure(error) }
        if !wasOpen { await closeUnlessUsed(user) }
        return try result.get()
    }

    /// Whether `user`'s store is open (or being opened) now.
    func isOpen(_ user: UserID) -> Bool {
        registry.state.withLock { $0.entries[user] != nil }
    }

    /// Opens, migrates and closes `user`'s store in one blocking job (a replicated store's close
    /// follows it, once the log has its last commits), when nothing has it open
    /// and there is room for one more open store; nil (nothing done) otherwise. Throws what
    /// failed; the store then stays open, failed, as a request would leave it. Not retried
    /// here: a failed checkpoint's retry would find nothing to migrate and report the store
    /// current while its commits may not be durable yet. Requests for the user meanwhile wait
    /// for the job, as for any preparation, then open the store again.
    ///
    /// What this saves per store (docs/dev/performance-log.md): a second trip through the blocking pool
    /// for the close, and the last commit's fsync (``Migrator/Durability/checkpoint``).
    func migrateUnopened(_ user: UserID) async throws(StoreError) -> MigrationReport? {
        try registry.placement?.admit(user)
        let started: Result<Task<PreparationOutcome, Never>?, StoreError> = registry.state.withLock { state in
            if let damage = state.damaged[user] { return .failure(.storeDamaged(user: user, message: damage)) }
            guard state.entries[user] == nil, state.closing[user] == nil, state.hasRoom else { return .success(nil) }
            state.tick += 1
            return .success(state.startOpening(user, registry.preparation(&state, user, .open(migrate: true), closeAfter: true)))
        }
        guard let task = try started.get() else { return nil }
        switch await task.value {
        case .openFailed(let error):
            throw error
        case .closed(let report):
            return report
        case .prepared:
            // Still open: the job failed (the entry says why).
            let failure: StoreError? = registry.state.withLock { state in
                if case .failed(let error, _) = state.entries[user]?.phase { error } else { nil }
            }
            if let failure { throw failure }
            return nil
        }
    }

    /// Closes `user`'s store now, unless a request holds it or it is being prepared. A fleet
    /// migration opens thousands of stores nobody is using: kept open, each would push a store
    /// clients use out of the LRU (under load their requests would pay a reopen: the soak saw
    /// read p99 go from 1 to 20 ms during a fleet run), and every file SQLite opens looks
    /// through a process-wide list of the open ones (`unixOpen`), which grows with them.
    func closeUnlessUsed(_ user: UserID) async {
        let store: Store? = registry.state.withLock { state in
            guard let index = state.entries.index(forKey: user), state.entries.values[index].isIdle,
                  case .ready = state.entries.values[index].phase else { return nil }
            return state.takeOutForClosing(user)?.store
        }
        guard let store else { return }
        registry.observer.record(.storeClosed(user: user, idle: true))
        await registry.preparer.close(store)
        registry.state.withLock { state in state.closed(user) }
    }

    /// Verifies `user`'s store, never throwing: a store that cannot be opened is a report with
    /// that one problem.
    public func verify(_ user: UserID) async -> VerificationReport {
        do {
            return try await registry.verify(user)
        } catch {
            return VerificationReport(user: user.rawValue, schemaVersion: -1, pending: [], problems: [StoreError.from(error, user: user).description])
        }
    }
}

extension StoreRegistry {
    /// Fleet runs' work on one store at a time.
    public var fleet: StoreFleet { StoreFleet(registry: self) }
}
