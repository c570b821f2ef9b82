import Foundation
import GRDB
import Synchronization
import Testing
@testable import UserStoreCore

@Suite struct RegistryTests {
    /// Migration 2 is not idempotent: running it twice would insert two rows.
    private func countingMigrations(_ directory: TemporaryDirectory) throws -> MigrationSet {
        try MigrationFolder(directory)
            .write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
            .write("0002_count.sql", "INSERT INTO runs VALUES ('once');")
            .load()
    }

    @Test func concurrentFirstOpensOfOneNewUserMigrateExactlyOnce() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory))
        let migratedReports = try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<64 {
                group.addTask {
                    try await harness.registry.withStore(user("zoe"), reporting: { store, report in
                        _ = try await store.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM runs") }
                        return report?.migrated == true
                    })
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(migratedReports == 64) // every request waited for the one migration and saw it
        let rows = try await harness.registry.withStore(user("zoe")) { store in
            try await store.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM runs") }
        }
        #expect(rows == 1)
        #expect(harness.recorder.count { if case .migrationStarted = $0 { true } else { false } } == 1)
        #expect(harness.recorder.count { if case .storeCreated = $0 { true } else { false } } == 1)
    }

    @Test func differentUsersOpenInParallelAndEachMigratesOnce() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<200 {
                group.addTask {
                    try await harness.registry.withStore(user("user\(index % 25)")) { store in
                        try await store.write { try $0.execute(sql: "INSERT INTO runs VALUES ('request')") }
                    }
                }
            }
            try await group.waitForAll()
        }
        for index in 0..<25 {
            let counts = try await harness.registry.withStore(user("user\(index)")) { store in
                try await store.read { db in
                    (try Int.fetchOne(db, sql: "SELECT count(*) FROM runs WHERE at = 'once'")!,
                     try Int.fetchOne(db, sql: "SELECT count(*) FROM runs WHERE at = 'request'")!)
                }
            }
            #expect(counts.0 == 1 && counts.1 == 8)
        }
        #expect(harness.recorder.count { if case .migrationStarted = $0 { true } else { false } } == 25)
    }

    @Test func neverHoldsMoreThanMaxOpenStores() async throws {
        let directory = try TemporaryDirectory()
        let limit = 8
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory), maxOpenStores: limit)
        let peakFiles = PeakCounter()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<(5 * limit * 4) {
                group.addTask {
                    try await harness.registry.withStore(user("cap\(index % (5 * limit))")) { store in
                        try await store.write { try $0.execute(sql: "INSERT INTO runs VALUES ('request')") }
                        let open = openStoreFiles(under: directory.path)
                        peakFiles.observe(open)
                    }
                }
            }
            try await group.waitForAll()
        }
        let statistics = harness.registry.statistics
        #expect(statistics.peakOpenStores == limit)
        #expect(statistics.openStores <= limit)
        #expect(peakFiles.peak <= limit)
        #expect(peakFiles.peak >= 1)
        #expect(harness.layout.allUsers().count == 5 * limit)
        await harness.registry.shutdown()
        #expect(openStoreFiles(under: directory.path) == 0)
    }

    /// A fleet migration opens stores nobody uses and closes each once migrated, so the stores
    /// clients use stay open (and the open files do not pile up).
    @Test func aFleetMigrationDoesNotPushStoresInUseOutOfTheLRU() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory), maxOpenStores: 3)
        for index in 0..<4 { _ = try await harness.registry.info(user("cold\(index)")) }
        _ = await harness.registry.closeIdleStores(now: .now + .seconds(3600))
        for index in 0..<2 { _ = try await harness.registry.info(user("hot\(index)")) }
        for index in 0..<4 {
            let outcome = await harness.registry.fleet.migrate(user("cold\(index)"), dryRun: false)
            #expect(outcome.state == .current)
        }
        let closedHot = harness.recorder.count { event in
            if case .storeClosed(let closed, _) = event { closed.rawValue.hasPrefix("hot") } else { false }
        }
        let closedCold = harness.recorder.count { event in
            if case .storeClosed(let closed, _) = event { closed.rawValue.hasPrefix("cold") } else { false }
        }
        #expect(closedHot == 0, "a store in use was closed to make room for the fleet migration")
        #expect(closedCold >= 4 + 3, "the fleet's stores made room for each other")
        #expect(harness.registry.statistics.openStores == 2, "only the stores in use stay open")
    }

    /// A fleet run opens, migrates and closes a store nobody had open in one job; requests for
    /// it meanwhile wait for that job, then open it again. Whatever the interleaving, every
    /// store is migrated exactly once and every request sees it migrated.
    @Test func requestsDuringAFleetRunsOneJobWaitForItAndReopenTheStore() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
        let users = (0..<24).map { user("racer\($0)") }
        try await Harness.seed(users, in: directory, migrations: try folder.load())
        try folder.write("0002_count.sql", "INSERT INTO runs VALUES ('once');")
        let harness = try Harness(directory: directory, migrations: try folder.load(), maxOpenStores: 64)
        let (fleet, versions) = try await withThrowingTaskGroup(of: (FleetOutcome?, Int64?).self) { group in
            for id in users {
                group.addTask { (await harness.registry.fleet.migrate(id, dryRun: false), nil) }
                for _ in 0..<3 { group.addTask { (nil, try await harness.registry.info(id).schemaVersion) } }
            }
            var fleet: [FleetOutcome] = [], versions: [Int64] = []
            for try await (outcome, version) in group {
                if let outcome { fleet.append(outcome) }
                if let version { versions.append(version) }
            }
            return (fleet, versions)
        }
        #expect(fleet.count == users.count && fleet.allSatisfy { $0.state == .migrated || $0.state == .current })
        #expect(fleet.allSatisfy { $0.toVersion == 2 }, "\(fleet.map { ($0.user.rawValue, $0.state, $0.toVersion ?? -1) })")
        #expect(versions.count == 3 * users.count && versions.allSatisfy { $0 == 2 })
        let started = harness.recorder.count { if case .migrationStarted = $0 { true } else { false } }
        #expect(started == users.count, "each store migrated once, not \(started) runs for \(users.count) stores")
        await harness.registry.shutdown()
        #expect(harness.registry.statistics.openStores == 0, "every store the jobs closed was counted out")
        for id in users {
            #expect(try harness.inspect(id.rawValue) { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM runs") } == 1)
        }
    }

    /// `migrations.fleetSyncMethod`: with `syncfs` a fleet run's stores share file-system syncs
    /// (at most two per store, fewer when they wait together); with `fsync` none is made, each
    /// store syncing its own files. Either way every store ends migrated, in its database file.
    @Test(arguments: [MigrationPolicy.FleetSyncMethod.syncfs, .fsync])
    func fleetSyncMethodDecidesHowAFleetRunsStoresAreMadeDurable(_ method: MigrationPolicy.FleetSyncMethod) async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
        let users = (0..<16).map { user("synced\($0)") }
        try await Harness.seed(users, in: directory, migrations: try folder.load())
        try folder.write("0002_more.sql", "ALTER TABLE runs ADD COLUMN note TEXT;")
        var policy = MigrationPolicy()
        policy.fleetSyncMethod = method
        let harness = try Harness(directory: directory, migrations: try folder.load(), policy: policy)
        let outcomes = await withTaskGroup(of: FleetOutcome.self) { group in
            for id in users { group.addTask { await harness.registry.fleet.migrate(id, dryRun: false) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(outcomes.allSatisfy { $0.state == .migrated && $0.toVersion == 2 }, "\(outcomes.map { ($0.user.rawValue, $0.state) })")
        let syncs = harness.registry.preparer.fleetFileSystemSyncs
        if method == .syncfs {
            #expect(syncs >= 2 && syncs <= UInt64(2 * users.count), "\(syncs) syncfs for \(users.count) stores")
        } else {
            #expect(syncs == 0)
        }
        await harness.registry.shutdown()
        for id in users {
            let path = harness.layout.storePath(for: id)
            #expect(!FileManager.default.fileExists(atPath: path + "-wal"), "closed after its checkpoint")
            #expect(try harness.inspect(id.rawValue) { db in try Int64.fetchOne(db, sql: "PRAGMA user_version") } == 2)
        }
    }

    /// A registry whose every shared sync fails (EIO), over one store, "unsynced", at version 1
    /// with a migration to version 2 pending.
    func unsyncedStore(maxOpenStores: Int = 64) async throws -> Harness {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
        try await Harness.seed([user("unsynced")], in: directory, migrations: try folder.load())
        try folder.write("0002_more.sql", "ALTER TABLE runs ADD COLUMN note TEXT;")
        let failing = FileSystemSync(directory: directory.path) { _ in
            errno = EIO
            return -1
        }
        return try Harness(directory: directory, migrations: try folder.load(), maxOpenStores: maxOpenStores, fleetSync: failing)
    }

    /// A fleet run's store whose shared sync fails may hold commits that are not on disk: it is
    /// reported failed with a storage failure, refused to clients, and a second fleet run does
    /// not call it current (its plan, read from the connection, would find nothing to do).
    @Test func aStoreWhoseSharedSyncFailedIsRefusedAndNeverCalledCurrent() async throws {
        let harness = try await unsyncedStore()
        let registry = harness.registry
        let first = await registry.fleet.migrate(user("unsynced"), dryRun: false)
        #expect(first.state == .failed)
        #expect(first.error?.description.contains("may not be on disk") == true, "\(String(describing: first.error))")
        await #expect(throws: StoreError.self) { _ = try await registry.info(user("unsynced")) }
        let second = await registry.fleet.migrate(user("unsynced"), dryRun: false)
        #expect(second.state == .failed, "a store whose commits may not be on disk is not current: \(second.state)")
        await registry.shutdown()
    }

    /// A damaged store stays refused after it is closed to make room (the LRU): opened again, it
    /// would be served from what the kernel's cache holds. An administrator may still open it as
    /// it is; replacing it (here: deleting it) lifts the refusal.
    @Test func aDamagedStoreStaysRefusedAfterItIsClosedUntilItIsReplaced() async throws {
        let harness = try await unsyncedStore(maxOpenStores: 1)
        let registry = harness.registry
        #expect(await registry.fleet.migrate(user("unsynced"), dryRun: false).state == .failed)
        // The only slot goes to another user: the failed store is closed.
        _ = try await registry.info(user("other"))
        #expect(!registry.fleet.isOpen(user("unsynced")))
        func isDamaged(_ error: any Error) -> Bool { if case .storeDamaged? = error as? StoreError { true } else { false } }
        await #expect(performing: { _ = try await registry.info(user("unsynced")) }, throws: isDamaged)
        let again = await registry.fleet.migrate(user("unsynced"), dryRun: false)
        #expect(again.state == .failed && again.error.map(isDamaged) == true, "\(again.state) \(String(describing: again.error))")
        #expect(try await registry.withExistingStore(user("unsynced")) { _ in true }, "an administrator opens it as it is")
        await #expect(performing: { _ = try await registry.info(user("unsynced")) }, throws: isDamaged)
        _ = try await registry.lifecycle.delete(user("unsynced"), keepBackups: true)
        #expect(try await registry.info(user("unsynced")).schemaVersion == 2, "a new store once the damaged one is gone")
        await registry.shutdown()
    }

    /// A store in a folder mounted inside the data directory (another file system) is not
    /// written back by the data directory's `syncfs`: its fleet job syncs it file by file and
    /// waits for no shared sync, while a store beside it on the data directory's file system
    /// still shares them. Needs root (mounts a tmpfs).
    @Test(.enabled(if: getuid() == 0, "mounts a tmpfs"))
    func aStoreOnAnotherFileSystemIsSyncedFileByFile() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
        let (mounted, local) = (user("mounted"), user("local"))
        try await Harness.seed([mounted, local], in: directory, migrations: try folder.load())
        try folder.write("0002_more.sql", "ALTER TABLE runs ADD COLUMN note TEXT;")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        #expect(harness.layout.storeDirectory(for: mounted) != harness.layout.storeDirectory(for: local))
        // The store moves onto a tmpfs mounted over its own folder.
        let path = harness.layout.storePath(for: mounted)
        let contents = try Data(contentsOf: URL(fileURLWithPath: path))
        let mountPoint = harness.layout.storeDirectory(for: mounted)
        try #require(mount("tmpfs", mountPoint, "tmpfs", 0, nil) == 0, "mount: \(String(cString: strerror(errno)))")
        defer { _ = umount2(mountPoint, Int32(MNT_DETACH)); _ = directory }
        try contents.write(to: URL(fileURLWithPath: path))

        let onTmpfs = await harness.registry.fleet.migrate(mounted, dryRun: false)
        #expect(onTmpfs.state == .migrated && onTmpfs.toVersion == 2)
        #expect(harness.registry.preparer.fleetFileSystemSyncs == 0, "the data directory's syncfs does not cover a tmpfs")
        let beside = await harness.registry.fleet.migrate(local, dryRun: false)
        #expect(beside.state == .migrated && beside.toVersion == 2)
        #expect(harness.registry.preparer.fleetFileSystemSyncs >= 2)
        await harness.registry.shutdown()
        #expect(try harness.inspect(mounted.rawValue) { db in try Int64.fetchOne(db, sql: "PRAGMA user_version") } == 2)
    }

    /// A store whose migration fails in a fleet run's job is reported failed with the
    /// migration's error, tried once (not again at once), and stays open as failed, refused to
    /// clients like after a request's failed migration.
    @Test func aFleetRunsFailedJobReportsTheErrorOnceAndKeepsTheStoreFailed() async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_runs.sql", "CREATE TABLE runs (at TEXT);")
        try await Harness.seed([user("broken")], in: directory, migrations: try folder.load())
        try folder.write("0002_bad.sql", "INSERT INTO no_such_table VALUES (1);")
        let harness = try Harness(directory: directory, migrations: try folder.load())
        let outcome = await harness.registry.fleet.migrate(user("broken"), dryRun: false)
        #expect(outcome.state == .failed)
        guard case .migrationFailed(_, let version, _, _, _, let schemaVersion)? = outcome.error else {
            Issue.record("expected MigrationFailed, got \(String(describing: outcome.error))")
            return
        }
        #expect(version == 2 && schemaVersion == 1)
        let failures = harness.recorder.count { if case .migrationFailed = $0 { true } else { false } }
        #expect(failures == 1, "tried \(failures) times")
        #expect(harness.registry.statistics.failedStores == 1)
        await #expect(throws: StoreError.self) { try await harness.registry.info(user("broken")) }
    }

    @Test func idleStoresAreClosedAndReopenTransparently() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory), idleTimeout: .seconds(60))
        // The sweep's clock is passed in, measured from around the opens, never from `.now`
        // after them: on a starved runner the opens alone have taken over a minute.
        let beforeOpens = ContinuousClock.now
        for index in 0..<3 { _ = try await harness.registry.info(user("idle\(index)")) }
        let afterOpens = ContinuousClock.now
        #expect(await harness.registry.closeIdleStores(now: beforeOpens + .seconds(59)) == 0)
        #expect(await harness.registry.closeIdleStores(now: afterOpens + .seconds(60)) == 3)
        #expect(harness.registry.statistics.openStores == 0)
        #expect(try await harness.registry.info(user("idle1")).schemaVersion == 2)
        #expect(harness.recorder.count { if case .migrationStarted = $0 { true } else { false } } == 3)
    }

    /// The page caches of stores nobody used for a while go back (their pages are read from the
    /// file again when used); a store a request holds keeps its cache, and a closed store is
    /// never touched.
    @Test func idleStoresGiveBackTheirPageCaches() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory))
        let beforeUse = ContinuousClock.now
        var stores: [Store] = []
        for index in 0..<3 {
            stores.append(try await harness.registry.withStore(user("cache\(index)")) { store in
                try await store.write { db in
                    try db.execute(sql: "CREATE TABLE filler (x)")
                    for _ in 0..<200 { try db.execute(sql: "INSERT INTO filler VALUES (randomblob(500))") }
                }
                return store
            })
        }
        let afterUse = ContinuousClock.now
        // Not idle for long enough yet: nothing is released.
        #expect(harness.registry.releaseIdleMemory(idleFor: .seconds(60), now: beforeUse + .seconds(59)).stores == 0)
        // A store a request holds is skipped; the two others give back what their caches held.
        let whileHeld = try await harness.registry.withStore(user("cache0")) { _ in
            harness.registry.releaseIdleMemory(idleFor: .seconds(60), now: afterUse + .seconds(60))
        }
        #expect(whileHeld.stores == 2)
        #expect(whileHeld.before > 2 * 50 * 1024 && whileHeld.after < whileHeld.before / 4, "\(whileHeld)")
        let rest = harness.registry.releaseIdleMemory(idleFor: .seconds(60), now: .now + .seconds(60))
        #expect(rest.stores == 1 && rest.after < rest.before)
        // The pages come back from the file when the store is used.
        let count = try await harness.registry.withStore(user("cache1")) { store in
            try await store.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM filler") }
        }
        #expect(count == 200)
        // Closed: its connection is never used again.
        #expect(await harness.registry.closeIdleStores(now: .now + .seconds(3600)) == 3)
        #expect(stores.allSatisfy { $0.releaseMemoryIfIdle() == nil })
    }

    @Test func aStoreIsNotClosedWhileARequestHoldsIt() async throws {
        let directory = try TemporaryDirectory()
        let harness = try Harness(directory: directory, migrations: try countingMigrations(directory), maxOpenStores: 1)
        let (entered, enteredContinuation) = AsyncStream<Void>.makeStream()
        let (finish, finishContinuation) = AsyncStream<Void>.makeStream()
        async let holder: Int? = harness.registry.withStore(user("holder")) { store in
            enteredContinuation.yield()
            for await _ in finish { break }
            return try await store.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM runs") }
        }
        for await _ in entered { break }
        #expect(await harness.registry.closeIdleStores(now: .now + .seconds(3600)) == 0)
        async let other: Int64 = harness.registry.info(user("other")).schemaVersion
        finishContinuation.yield()
        #expect(try await holder == 1)
        #expect(try await other == 2)
        #expect(harness.registry.statistics.peakOpenStores == 1)
    }

    @Test func theDataDirectoryLockIsExclusive() throws {
        let directory = try TemporaryDirectory()
        let layout = StoreLayout(dataDirectory: directory.path + "/data")
        var first: DataDirectoryLock? = try DataDirectoryLock(layout: layout)
        #expect(DataDirectoryLock.isHeld(layout: layout))
        let error = #expect(throws: DataDirectoryLock.LockError.self) { try DataDirectoryLock(layout: layout) }
        #expect(error == .held(path: layout.lockPath, pid: getpid()))
        _ = first
        first = nil
        // The kernel drops the lock when the last descriptor of its open file closes. Another
        // test of this process that spawns a program at that moment briefly holds a copy (between
        // its fork and its exec, which closes it: O_CLOEXEC), so this polls for a bounded time.
        var second: DataDirectoryLock?
        for _ in 0..<200 where second == nil {
            second = try? DataDirectoryLock(layout: layout)
            if second == nil { usleep(10_000) }
        }
        #expect(second != nil, "still held 2 s after its only holder released it")
    }

    @Test func invalidIDsCreateNothing() throws {
        let directory = try TemporaryDirectory()
        let layout = StoreLayout(dataDirectory: directory.path + "/data")
        for id in ["", ".", "..", "a/b", "../x", "a\u{0}b", String(repeating: "x", count: 129), ".hidden", "-x", "a b", "é"] {
            #expect(throws: UserIDError.self) { try UserID(id) }
        }
        #expect(!FileManager.default.fileExists(atPath: layout.dataDirectory))
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).isEmpty)
    }
}

/// How many store files under `directory` this process has open, from /proc/self/fd.
func openStoreFiles(under directory: String) -> Int {
    let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return descriptors.filter { fd in
        let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + fd)) ?? ""
        return target.hasPrefix(directory + "/") && target.contains("/stores/") && target.hasSuffix(".sqlite")
    }.count
}

/// The highest value observed, from many tasks.
final class PeakCounter: Sendable {
    private let value = Mutex(0)
    func observe(_ sample: Int) { value.withLock { $0 = max($0, sample) } }
    var peak: Int { value.withLock { $0 } }
}
