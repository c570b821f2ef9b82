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
            let report = try await migrate(user)
            return FleetOutcome(user: user, state: report.migrated ? .migrated : .current, fromVersion: report.fromVersion, toVersion: report.toVersion)
        } catch {
            return FleetOutcome(user: user, state: .failed, error: Self.storeError(error, user: user))
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
