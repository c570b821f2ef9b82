import GRDB

/// What migrating one store would do. Computed without writing anything.
public struct MigrationPlan: Sendable, Equatable {
    /// The store has no bookkeeping yet (new file).
    public var isNewStore: Bool
    /// Schema version now.
    public var fromVersion: Int64
    /// Schema version after the plan ran.
    public var toVersion: Int64
    /// Migrations to apply, ascending.
    public var steps: [Migration]
    /// Steps whose SQL app-version gating will skip (they are recorded all the same).
    public var skippedVersions: Set<Int64>
    /// The recorded app version differs from the running one (the row gets updated).
    public var appVersionChanged: Bool
    /// The app version recorded in the store before this run (nil for a new store).
    public var recordedAppVersion: String?
    /// The store must be reconciled with the desired schema after the steps.
    public var reconcile: Bool = false
    /// The reconcile's SQL; filled in by ``StoreRegistry/plan(_:)`` only (it simulates the
    /// steps on a copy to know it), since migrating plans the reconcile under the write lock.
    public var reconcileStatements: [String] = []
    /// The versions applied before the run, when the plan read them (the migrator then keeps
    /// the bookkeeping's fingerprint without reading them back after each step).
    public var appliedVersions: [Int64]?
    /// Whether the store is copied before the steps run, and why; nil when nothing runs.
    public var backup: BackupDecision?
    /// Pending versions a staged release holds back from this store for now (it is outside
    /// the current step's cohort, or the release is halted or aborted).
    public var heldVersions: [Int64] = []
    /// Versions the store has that the loaded migrations do not know, every one marked
    /// `-- Compatible`: the store is served as it is (a rolling deploy's older daemon).
    public var aheadVersions: [Int64] = []

    /// Nothing to write at all.
    public var isEmpty: Bool { steps.isEmpty && !appVersionChanged && !isNewStore && !reconcile }
}

/// What a migration run did.
public struct MigrationReport: Sendable, Equatable {
    public var user: UserID
    /// The file was created by this run.
    public var created: Bool
    public var fromVersion: Int64
    public var toVersion: Int64
    /// Versions applied by this run, ascending.
    public var applied: [Int64]
    /// The app version recorded in the store after the run.
    public var appVersion: String
    /// Path of the copy taken before migrating, if one was.
    public var backupPath: String?
    /// Wall time of the run.
    public var durationMicroseconds: Int64
    /// Statements the desired-schema reconcile ran.
    public var reconciled: [String] = []
    /// Pending versions a staged release held back from this store (``MigrationPlan/heldVersions``).
    public var heldVersions: [Int64] = []

    /// Whether any migration (or a reconcile that changed something) ran.
    public var migrated: Bool { !applied.isEmpty || !reconciled.isEmpty }
}

/// Whether a store is copied before it is migrated (``MigrationPolicy/backupBeforeMigrating``),
/// and why: shown by `Plan` and in the journal's `migration-started` entry.
public struct BackupDecision: Sendable, Equatable {
    /// A copy is taken first.
    public var copy: Bool
    /// Why (or why not), e.g. `"0006_title_limit.sql: 'DROP TABLE notes' drops (or rebuilds) a table"`.
    public var reason: String

    public init(copy: Bool, reason: String) {
        self.copy = copy
        self.reason = reason
    }
}

extension MigrationPlan {
    /// What `migrator` would do to `db`, with the reconcile's statements when the declarative
    /// schema has some left (found on a copy of `db` that `simulator` migrated).
    static func make(_ db: Database, migrator: Migrator, simulator: Migrator, schema: DesiredSchema?, created: Bool) throws -> MigrationPlan {
        var plan = try migrator.plan(db)
        guard plan.reconcile, let schema else { return plan }
        // The reconcile's SQL depends on the schema the steps leave: find it on a copy with
        // the steps applied.
        let copy = try DatabaseQueue()
        try copy.writeWithoutTransaction { copyDB in try db.backup(to: copyDB) }
        plan.reconcileStatements = try copy.writeWithoutTransaction { copyDB in
            _ = try simulator.migrate(copyDB, created: created, reconcile: false)
            return try schema.plan(copyDB).statements
        }
        return plan
    }
}
