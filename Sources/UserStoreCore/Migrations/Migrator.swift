import Foundation
import GRDB

/// Brings one store's schema up to date with a ``MigrationSet``; every method runs on the
/// store's own connection (inside `writeWithoutTransaction`), so it is serial with all other
/// work on that store.
///
/// Safety rules (see docs/migrations.md):
/// - each migration runs in its own `BEGIN IMMEDIATE` transaction together with its bookkeeping,
///   so a crash leaves the store at the previous or the next version, never in between;
/// - foreign keys are switched off *before* the transaction (inside one it is a no-op) and
///   `PRAGMA foreign_key_check` must pass before commit;
/// - whether a migration is applied is re-checked inside its transaction, under SQLite's write
///   lock, so two runs can never apply it twice.
struct Migrator: Sendable {
    let user: UserID
    let migrations: MigrationSet
    let appVersion: AppVersion
    let policy: MigrationPolicy
    let observer: any StoreObserver
    let backups: BackupKeeper
    /// How the run's commits become durable. `.lastCommit`: the last commit is written with
    /// `synchronous=FULL`. `.checkpoint`: every commit is `NORMAL` and the run ends with a
    /// checkpoint, which syncs the WAL and then the database file — the same two fsyncs the
    /// close's checkpoint would pay anyway, with the last commit's fsync saved. `.shared`: every
    /// commit and the closing checkpoint write without fsync (`synchronous=OFF`), and a shared
    /// file-system sync runs before the checkpoint (the WAL is durable before the database file
    /// changes) and after it. The last two are for a store the caller closes right after (a
    /// fleet run), and only where no other connection can hold the WAL back from a full
    /// checkpoint (exclusive locking: no replicator).
    var durability: Durability = .lastCommit
    /// The versions this run may apply (a staged release holds the others back:
    /// ``MigrationGate``); nil: all. A store held back keeps its recorded app version and is
    /// not reconciled with the desired schema.
    var allowed: Set<Int64>?

    enum Durability: Sendable {
        case lastCommit, checkpoint
        case shared(FileSystemSync)

        /// Every commit is written without the FULL sync of the last.
        var defersSync: Bool { if case .lastCommit = self { false } else { true } }
    }

    /// A `.shared` run whose file-system sync failed: its commits may not be on disk although
    /// this connection (and the kernel's cache) shows them, so the store must not be served
    /// from it (``StoreRegistry`` marks it damaged); `failure` is what to report.
    struct NotDurable: Error { let failure: StoreError }

    // MARK: Planning

    /// What ``migrate(_:)`` would do. Costs one `PRAGMA user_version` and one row of
    /// `app_version` when the store is current; reads `schema_migrations` only when it is not.
    func plan(_ db: Database) throws -> MigrationPlan {
        let userVersion = try Bookkeeping.userVersion(db)
        if userVersion > migrations.latestVersion {
            return try aheadPlan(db, userVersion: userVersion)
        }
        guard let info = try Bookkeeping.read(db) else {
            guard userVersion == 0 else {
                throw StoreError.storeDamaged(user: user, message: "user_version is \(userVersion) but the app_version table is missing")
            }
            let (steps, held) = admitted(migrations.migrations)
            var plan = MigrationPlan(isNewStore: true, fromVersion: 0, toVersion: steps.last?.version ?? 0,
                                     steps: steps, skippedVersions: skipped(steps, recorded: appVersion.text),
                                     appVersionChanged: false, recordedAppVersion: nil, reconcile: migrations.schema != nil && held.isEmpty)
            plan.appliedVersions = []
            plan.heldVersions = held
            return plan
        }
        guard info.schemaVersion == userVersion else {
            throw StoreError.storeDamaged(user: user, message: "app_version says schema version \(info.schemaVersion) but user_version is \(userVersion)")
        }
        let appVersionChanged = info.appVersion != appVersion.text
        let schemaChanged = info.schemaHash != migrations.schema?.hash
        if userVersion == migrations.latestVersion, info.migrationsFingerprint == migrations.fingerprint {
            var plan = MigrationPlan(isNewStore: false, fromVersion: userVersion, toVersion: userVersion, steps: [],
                                     skippedVersions: [], appVersionChanged: appVersionChanged, recordedAppVersion: info.appVersion,
                                     reconcile: schemaChanged && migrations.schema != nil)
            if plan.reconcile { plan.backup = try backupDecision(db, plan) }
            return plan
        }
        let (unapplied, applied) = try pendingMigrations(db, latestApplied: userVersion)
        let (pending, held) = admitted(unapplied)
        var plan = MigrationPlan(isNewStore: false, fromVersion: userVersion,
                                 toVersion: max(userVersion, pending.last?.version ?? 0), steps: pending,
                                 skippedVersions: skipped(pending, recorded: info.appVersion),
                                 appVersionChanged: appVersionChanged && held.isEmpty, recordedAppVersion: info.appVersion,
                                 reconcile: migrations.schema != nil && (schemaChanged || !pending.isEmpty) && held.isEmpty)
        plan.appliedVersions = applied
        plan.heldVersions = held
        plan.backup = try backupDecision(db, plan)
        return plan
    }

    /// A store migrated past the migrations loaded here (by another host, or a newer build
    /// during a rolling deploy): served as it is when every migration it is ahead by was marked
    /// `-- Compatible` when applied; otherwise refused with `StoreTooNew`. Nothing is written to
    /// it (its recorded app version stays the newer one).
    private func aheadPlan(_ db: Database, userVersion: Int64) throws -> MigrationPlan {
        let refusal = StoreError.storeTooNew(user: user, storeVersion: userVersion, knownVersion: migrations.latestVersion)
        guard let info = try Bookkeeping.read(db), info.schemaVersion == userVersion else { throw refusal }
        let ahead = try Bookkeeping.applied(above: migrations.latestVersion, db)
        guard !ahead.isEmpty, ahead.allSatisfy(\.compatible) else { throw refusal }
        var plan = MigrationPlan(isNewStore: false, fromVersion: userVersion, toVersion: userVersion, steps: [], skippedVersions: [],
                                 appVersionChanged: false, recordedAppVersion: info.appVersion, reconcile: false)
        plan.aheadVersions = ahead.map(\.version)
        return plan
    }

    /// `steps` split into the ones this run may apply and the versions held back (``allowed``).
    private func admitted(_ steps: [Migration]) -> (admitted: [Migration], held: [Int64]) {
        guard let allowed else { return (steps, []) }
        return (steps.filter { allowed.contains($0.version) }, steps.filter { !allowed.contains($0.version) }.map(\.version))
    }

    /// Whether migrating an existing store per `plan` copies it first, and why (the rule of
    /// ``MigrationPolicy/BackupMode``; docs/migrations.md). Nil when nothing runs.
    private func backupDecision(_ db: Database, _ plan: MigrationPlan) throws -> BackupDecision? {
        guard !plan.steps.isEmpty || plan.reconcile else { return nil }
        guard plan.fromVersion > 0 else { return BackupDecision(copy: false, reason: "the store holds no migrated data yet") }
        switch policy.backupBeforeMigrating {
        case .never: return BackupDecision(copy: false, reason: "backupBeforeMigrating is false")
        case .always: return BackupDecision(copy: true, reason: "backupBeforeMigrating is true")
        case .auto: break
        }
        let running = plan.steps.filter { !plan.skippedVersions.contains($0.version) }
        if let lossy = running.first(where: { $0.dataLossReason != nil }), let reason = lossy.dataLossReason {
            return BackupDecision(copy: true, reason: reason)
        }
        if plan.reconcile, policy.allowDestructiveSchemaChanges {
            return BackupDecision(copy: true, reason: "the desired-schema reconcile may drop tables or columns (allowDestructiveSchemaChanges)")
        }
        if let inserting = running.first(where: \.insertsRows), try Bool.fetchOne(db, sql: Self.rewritingSchemaQuery) == true {
            return BackupDecision(copy: true, reason: "\(inserting.fileName): an INSERT may fire a trigger or an ON CONFLICT REPLACE clause of this store")
        }
        return BackupDecision(copy: false, reason: "every pending migration only adds (backupBeforeMigrating: auto)")
    }

    /// Whether the store has something that turns an INSERT into a delete or an update.
    private static let rewritingSchemaQuery = """
        SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger'
                       OR (type = 'table' AND upper(sql) LIKE '%REPLACE%'))
        """

    /// Known migrations not applied to this store, after checking the applied ones.
    private func pendingMigrations(_ db: Database, latestApplied: Int64) throws -> (pending: [Migration], applied: [Int64]) {
        let applied = try Bookkeeping.applied(db)
        var appliedVersions = Set<Int64>()
        for row in applied {
            appliedVersions.insert(row.version)
            guard let known = migrations.migration(version: row.version) else {
                observer.record(.unknownAppliedMigration(user: user, version: row.version, name: row.name))
                continue
            }
            if known.checksum != row.checksum {
                let error = StoreError.checksumMismatch(user: user, version: row.version, migration: known.fileName,
                                                        recorded: row.checksum, current: known.checksum)
                if policy.checksumMismatch == .refuse { throw error }
                observer.record(.storeRefused(user: user, error: error))
            }
        }
        let pending = migrations.migrations.filter { !appliedVersions.contains($0.version) }
        if !policy.allowOutOfOrder, let early = pending.first(where: { $0.version < latestApplied }) {
            throw StoreError.outOfOrderMigration(user: user, version: early.version, migration: early.fileName, latestApplied: latestApplied)
        }
        return (pending, applied.map(\.version))
    }

    /// Versions whose app-version gate excludes a store last opened by `recorded`.
    private func skipped(_ steps: [Migration], recorded: String) -> Set<Int64> {
        let recordedVersion = try? AppVersion(recorded)
        var result = Set<Int64>()
        for step in steps {
            guard let gate = step.appVersionBelow else { continue }
            // An unparseable recorded version cannot be proven old: run the fix (it was written for old data).
            if let recordedVersion, recordedVersion >= gate { result.insert(step.version) }
        }
        return result
    }

    // MARK: Migrating

    /// Applies the plan. Throws ``StoreError``; a failed step is rolled back and the store stays
    /// at the last committed version.
    func migrate(_ db: Database, created: Bool, reconcile reconciling: Bool = true) throws -> MigrationReport {
        let started = DispatchTime.now()
        let plan = try self.plan(db)
        var report = MigrationReport(user: user, created: created, fromVersion: plan.fromVersion, toVersion: plan.fromVersion,
                                     applied: [], appVersion: plan.recordedAppVersion ?? appVersion.text,
                                     backupPath: nil, durationMicroseconds: 0)
        report.heldVersions = plan.heldVersions
        if plan.isEmpty { return report }

        let reconciles = plan.reconcile && reconciling && migrations.schema != nil
        let recordsAppVersionOnly = plan.steps.isEmpty && plan.appVersionChanged
        let commits = (plan.isNewStore ? 1 : 0) + plan.steps.count + (reconciles ? 1 : 0) + (recordsAppVersionOnly ? 1 : 0)
        let sync = try RunSync(db, durability: durability, user: user, commits: commits)
        defer { sync.end() }
        let beforeCommit = sync.beforeCommit

        if plan.isNewStore {
            if case .shared = durability {
                // Switched while the connection still syncs: under `.shared`'s OFF, the switch's
                // write of the new file's page 1 (a rollback-journal transaction) is not synced,
                // and a power cut could leave a torn header that refuses the store as damaged.
                try db.execute(sql: "PRAGMA journal_mode = WAL")
                try beforeCommit()
            } else {
                try beforeCommit()
                try db.execute(sql: "PRAGMA journal_mode = WAL")
            }
            try db.inTransaction(.immediate) {
                if try !Bookkeeping.exists(db) { try Bookkeeping.initialise(db, appVersion: appVersion) }
                return .commit
            }
        } else if !plan.steps.isEmpty || plan.reconcile {
            try ensureWAL(db)
            if plan.backup?.copy == true {
                let path = try backups.take(db, user: user, schemaVersion: plan.fromVersion, reason: .beforeMigration)
                report.backupPath = path
                observer.record(.backupCreated(user: user, path: path, schemaVersion: plan.fromVersion))
            }
        }

        let totalSteps = plan.steps.count + (plan.reconcile ? 1 : 0)
        if totalSteps > 0 {
            observer.record(.migrationStarted(user: user, from: plan.fromVersion, to: plan.toVersion, steps: totalSteps, backup: plan.backup))
        }
        // Foreign keys off once for all the run's transactions (each still checks them before
        // it commits): the PRAGMA is a no-op inside a transaction, and parsed anew each time.
        var appliedVersions = plan.appliedVersions
        try withForeignKeysOff(db) {
            for (index, migration) in plan.steps.enumerated() {
                let isLast = index == plan.steps.count - 1
                let skip = plan.skippedVersions.contains(migration.version)
                try beforeCommit()
                let duration = try apply(db, migration, skip: skip, isLast: isLast, schemaVersion: report.toVersion, applied: appliedVersions)
                appliedVersions?.append(migration.version) // by this run or, when nil came back, an earlier one
                if let duration {
                    report.applied.append(migration.version)
                    report.toVersion = max(report.toVersion, migration.version)
                    observer.record(.migrationStep(user: user, version: migration.version, migration: migration.fileName,
                                                   step: index + 1, steps: totalSteps, durationMicroseconds: duration, skipped: skip))
                }
            }
            if reconciles, let schema = migrations.schema {
                try beforeCommit()
                let started = DispatchTime.now()
                report.reconciled = try reconcile(db, schema: schema, schemaVersion: report.toVersion)
                observer.record(.migrationStep(user: user, version: report.toVersion, migration: schema.fileName, step: totalSteps, steps: totalSteps,
                                               durationMicroseconds: Self.microseconds(since: started), skipped: false))
            }
        }
        if recordsAppVersionOnly {
            try beforeCommit()
            try db.inTransaction(.immediate) {
                _ = try Bookkeeping.syncVersion(db, appVersion: appVersion)
                return .commit
            }
        }
        try sync.makeDurable()
        if plan.heldVersions.isEmpty || plan.isNewStore { report.appVersion = appVersion.text }
        report.durationMicroseconds = Self.microseconds(since: started)
        if totalSteps > 0 {
            observer.record(.migrationFinished(user: user, from: report.fromVersion, to: report.toVersion,
                                               steps: totalSteps, durationMicroseconds: report.durationMicroseconds))
            backups.prune(user: user, olderThanSeconds: policy.backupRetentionSeconds)
        }
        return report
    }

    /// Runs one migration in its own transaction, foreign keys already off. Returns its
    /// duration, or nil when another run had already applied it. `applied`: the versions
    /// applied before it, when known (saves reading them back).
    private func apply(_ db: Database, _ migration: Migration, skip: Bool, isLast: Bool, schemaVersion: Int64, applied: [Int64]?) throws -> Int64? {
        let started = DispatchTime.now()
        var duration: Int64?
        do {
            try db.inTransaction(.immediate) {
                if try Bookkeeping.isApplied(db, version: migration.version) { return .rollback }
                if !skip {
                    for statement in migration.up { try db.execute(sql: statement) }
                }
                try checkForeignKeys(db)
                let elapsed = Self.microseconds(since: started)
                try Bookkeeping.recordApplied(db, migration, durationMicroseconds: elapsed, appVersion: appVersion, skipped: skip)
                // The recorded app version moves only with the last step: if the run stops
                // half-way, gating on the next run still sees the old version.
                _ = try Bookkeeping.syncVersion(db, appVersion: isLast ? appVersion : nil, versions: applied.map { $0 + [migration.version] })
                duration = elapsed
                return .commit
            }
        } catch {
            let failure = Self.failure(error, user: user, migration: migration, schemaVersion: (try? Bookkeeping.userVersion(db)) ?? schemaVersion)
            observer.record(.migrationFailed(user: user, error: failure))
            throw failure
        }
        return duration
    }

    /// Reconciles the store with the desired schema in one transaction, like a migration:
    /// planned again under the write lock, destructive changes refused unless allowed, foreign
    /// keys off before and checked before commit, the schema's hash recorded with it.
    /// Returns the statements run.
    private func reconcile(_ db: Database, schema: DesiredSchema, schemaVersion: Int64) throws -> [String] {
        var applied: [String] = []
        let pseudo = Migration(version: schemaVersion, name: schema.fileName, fileName: schema.fileName, up: [], down: nil, checksum: schema.hash)
        do {
            try db.inTransaction(.immediate) {
                let plan = try schema.plan(db)
                if !plan.destructive.isEmpty, !policy.allowDestructiveSchemaChanges {
                    throw StoreError.migrationFailed(
                        user: user, version: schemaVersion, migration: schema.fileName,
                        message: "refused destructive change (set allowDestructiveSchemaChanges to allow it): " + plan.destructive.joined(separator: "; "),
                        sqliteCode: nil, schemaVersion: schemaVersion)
                }
                for statement in plan.statements { try db.execute(sql: statement) }
                try checkForeignKeys(db)
                try Bookkeeping.recordSchemaHash(db, schema.hash)
                applied = plan.statements
                return .commit
            }
        } catch {
            let failure = Self.failure(error, user: user, migration: pseudo, schemaVersion: schemaVersion)
            observer.record(.migrationFailed(user: user, error: failure))
            throw failure
        }
        return applied
    }

    // MARK: Rolling back

    /// Runs the Down sections of every applied migration above `target`, newest first, each in
    /// its own transaction. Checks that all of them are reversible before changing anything.
    func rollback(_ db: Database, to target: Int64) throws -> [Int64] {
        let applied = try Bookkeeping.applied(db).filter { $0.version > target }.reversed()
        var downs: [(AppliedMigration, [String])] = []
        for row in applied {
            if row.skipped { downs.append((row, [])); continue }
            if let down = migrations.migration(version: row.version)?.down {
                downs.append((row, down))
            } else if let recorded = row.downSQL {
                downs.append((row, SQLScript(recorded).statements))
            } else {
                throw StoreError.irreversibleMigration(user: user, version: row.version, migration: migrations.migration(version: row.version)?.fileName ?? row.name)
            }
        }
        try ensureWAL(db)
        var undone: [Int64] = []
        for (row, statements) in downs {
            let started = DispatchTime.now()
            try withForeignKeysOff(db) {
                do {
                    try db.inTransaction(.immediate) {
                        for statement in statements { try db.execute(sql: statement) }
                        try checkForeignKeys(db)
                        try db.execute(sql: "DELETE FROM schema_migrations WHERE version = ?", arguments: [row.version])
                        _ = try Bookkeeping.syncVersion(db, appVersion: nil)
                        return .commit
                    }
                } catch {
                    let migration = migrations.migration(version: row.version)
                    throw Self.failure(error, user: user, migration: migration ?? Migration(version: row.version, name: row.name, fileName: row.name, up: [], down: nil, checksum: row.checksum),
                                       schemaVersion: (try? Bookkeeping.userVersion(db)) ?? row.version)
                }
            }
            undone.append(row.version)
            observer.record(.rollbackStep(user: user, version: row.version, migration: migrations.migration(version: row.version)?.fileName ?? row.name,
                                          durationMicroseconds: Self.microseconds(since: started)))
        }
        return undone
    }

    // MARK: Checksums

    /// Records the current files' checksums for applied migrations whose files changed
    /// (all of them, or only `versions`). Returns the versions updated.
    func acceptChecksums(_ db: Database, versions: Set<Int64>?) throws -> [Int64] {
        var accepted: [Int64] = []
        try db.inTransaction(.immediate) {
            for row in try Bookkeeping.applied(db) where versions?.contains(row.version) ?? true {
                guard let known = migrations.migration(version: row.version), known.checksum != row.checksum else { continue }
                try Bookkeeping.acceptChecksum(db, version: row.version, checksum: known.checksum)
                accepted.append(row.version)
            }
            return .commit
        }
        return accepted
    }

    // MARK: Helpers

    private func ensureWAL(_ db: Database) throws {
        let mode = try String.fetchOne(db, sql: "PRAGMA journal_mode")
        if mode?.lowercased() != "wal" { try db.execute(sql: "PRAGMA journal_mode = WAL") }
    }

    /// `PRAGMA foreign_keys` is a no-op inside a transaction, so it is switched off here, before
    /// the transaction begins, and back on afterwards whatever happens.
    private func withForeignKeysOff(_ db: Database, _ body: () throws -> Void) throws {
        try db.execute(sql: "PRAGMA foreign_keys = OFF")
        defer { try? db.execute(sql: "PRAGMA foreign_keys = ON") }
        try body()
    }

    private func checkForeignKeys(_ db: Database) throws {
        // The PRAGMA, not the pragma_foreign_key_check table: a SELECT over it costs a query plan.
        var violations: [Row] = []
        let cursor = try Row.fetchCursor(db, sql: "PRAGMA foreign_key_check")
        while violations.count < 6, let row = try cursor.next() { violations.append(row.copy()) }
        guard let first = violations.first else { return }
        let table: String = first[0], parent: String = first[2]
        let rowid: Int64? = first[1]
        let more = violations.count > 1 ? " (and \(violations.count - 1)\(violations.count > 5 ? "+" : "") more)" : ""
        throw ForeignKeyViolation(message: "foreign key check failed: row \(rowid.map(String.init) ?? "?") of \(table) references a missing row of \(parent)\(more)")
    }

    private struct ForeignKeyViolation: Error { let message: String }

    private static func failure(_ error: any Error, user: UserID, migration: Migration, schemaVersion: Int64) -> StoreError {
        switch error {
        case let error as StoreError:
            return error
        case let error as ForeignKeyViolation:
            return .migrationFailed(user: user, version: migration.version, migration: migration.fileName,
                                    message: error.message, sqliteCode: nil, schemaVersion: schemaVersion)
        case let error as DatabaseError:
            return .migrationFailed(user: user, version: migration.version, migration: migration.fileName,
                                    message: error.message ?? "\(error.resultCode)", sqliteCode: error.extendedResultCode.rawValue,
                                    schemaVersion: schemaVersion)
        default:
            return .migrationFailed(user: user, version: migration.version, migration: migration.fileName,
                                    message: "\(error)", sqliteCode: nil, schemaVersion: schemaVersion)
        }
    }

    static func microseconds(since start: DispatchTime) -> Int64 {
        Int64((DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1_000)
    }
}
