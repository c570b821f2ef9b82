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
    }

    public var user: UserID
    public var state: State
    public var fromVersion: Int64?
    public var toVersion: Int64?
    /// Why the store failed.
    public var error: StoreError?
}

extension StoreRegistry {
    /// Migrates `user`'s store (plans it, with `dryRun`) and says how it went, never throwing:
    /// one store's failure is part of a fleet's outcome.
    public func fleetMigrate(_ user: UserID, dryRun: Bool) async -> FleetOutcome {
        do {
            if dryRun {
                let plan = try await self.plan(user)
                let current = plan.steps.isEmpty && !plan.isNewStore && !plan.reconcile
                return FleetOutcome(user: user, state: current ? .current : .planned, fromVersion: plan.fromVersion, toVersion: plan.toVersion)
            }
            let wasOpen = isOpen(user)
            let report = try await migrate(user)
            if !wasOpen { await closeUnlessUsed(user) }
            return FleetOutcome(user: user, state: report.migrated ? .migrated : .current, fromVersion: report.fromVersion, toVersion: report.toVersion)
        } catch {
            return FleetOutcome(user: user, state: .failed, error: Self.storeError(error, user: user))
        }
    }

    /// Whether `user`'s store is open (or being opened) now.
    func isOpen(_ user: UserID) -> Bool {
        state.withLock { $0.entries[user] != nil }
    }

    /// Closes `user`'s store now, unless a request holds it or it is being prepared. A fleet
    /// migration opens thousands of stores nobody is using: kept open, each would push a store
    /// clients use out of the LRU (under load their requests would pay a reopen: the soak saw
    /// read p99 go from 1 to 20 ms during a fleet run), and every file SQLite opens looks
    /// through a process-wide list of the open ones (`unixOpen`), which grows with them.
    func closeUnlessUsed(_ user: UserID) async {
        let store: Store? = state.withLock { state in
            guard let index = state.entries.index(forKey: user), state.entries.values[index].isIdle,
                  case .ready = state.entries.values[index].phase else { return nil }
            return state.entries.remove(at: index).value.store
        }
        guard let store else { return }
        observer.record(.storeClosed(user: user, idle: true))
        await close(store)
        state.withLock { state in
            state.holding -= 1
            state.wakeWaiters()
        }
    }

    /// Verifies `user`'s store, never throwing: a store that cannot be opened is a report with
    /// that one problem.
    public func fleetVerify(_ user: UserID) async -> VerificationReport {
        do {
            return try await verify(user)
        } catch {
            return VerificationReport(user: user.rawValue, schemaVersion: -1, pending: [], problems: [Self.storeError(error, user: user).description])
        }
    }
}
