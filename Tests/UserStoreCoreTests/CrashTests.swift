import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// A child process is SIGKILLed at random moments while it backs up and migrates a store; the
/// store must always be found at version N or N+1, intact, with bookkeeping matching the schema.
/// Under `backupBeforeMigrating: auto` (the default) twice: a migration that updates rows (the
/// store is copied first) and one that only adds (no copy).
@Suite(.serialized) struct CrashTests {
    static let rows = 200_000

    @Test(.timeLimit(.minutes(10)), arguments: [true, false])
    func sigkillDuringALongMigrationLeavesVersionNOrNPlusOne(rewritesRows: Bool) async throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_base.sql", """
                CREATE TABLE base (id INTEGER PRIMARY KEY, x INTEGER NOT NULL);
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
                INSERT INTO base (id, x) SELECT i, i FROM n;
                """)
        // Build the store at version 1, then keep a pristine copy of it.
        let layout = StoreLayout(dataDirectory: directory.path + "/data")
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load())
            #expect(try await harness.registry.info(user("victim")).schemaVersion == 1)
            await harness.registry.shutdown()
        }
        let storePath = layout.storePath(for: user("victim"))
        let pristine = directory.path + "/pristine.sqlite"
        try FileManager.default.copyItem(atPath: storePath, toPath: pristine)
        try folder.write("0002_long.sql", """
            CREATE TABLE big (id INTEGER PRIMARY KEY, payload TEXT NOT NULL);
            INSERT INTO big (id, payload) SELECT (b1.id - 1) * \(Self.rows / 1000) + b2.id, hex(randomblob(16))
                FROM base AS b1, base AS b2 WHERE b2.id <= \(Self.rows / 1000);
            CREATE INDEX big_by_payload ON big (payload);
            \(rewritesRows ? "UPDATE base SET x = x + 1;" : "ALTER TABLE base ADD COLUMN y INTEGER;")
            """)
        #expect((try folder.load().migration(version: 2)!.dataLossReason != nil) == rewritesRows)

        // Calibrate: how long does an uninterrupted run take on this machine?
        let calibration = ContinuousClock().measure {
            restore(pristine, to: storePath)
            let run = runHelper(directory: directory, folder: folder, killAfter: nil)
            #expect(run.status == 0 && run.output.contains("migration-finished"), "\(run.output)")
        }
        try expectConsistent(storePath, allowed: [2], rewritesRows: rewritesRows)
        // auto copied the store only before the migration that updates rows.
        let copies = (try? FileManager.default.subpathsOfDirectory(atPath: layout.backupsDirectory))?.filter { $0.hasSuffix(".sqlite") } ?? []
        #expect(copies.isEmpty != rewritesRows, "\(copies)")
        let window = calibration.components.seconds * 1_000_000 + calibration.components.attoseconds / 1_000_000_000_000

        var outcomes: [Int64: Int] = [:]
        var killedMidMigration = 0, rolledBack = 0
        for _ in 0..<24 {
            restore(pristine, to: storePath)
            let delay = Int64.random(in: 0...(window * 11 / 10))
            let run = runHelper(directory: directory, folder: folder, killAfter: .microseconds(delay))
            let version = try expectConsistent(storePath, allowed: [1, 2], rewritesRows: rewritesRows)
            outcomes[version, default: 0] += 1
            // The child's own account: the kill landed after its migration began and before it
            // reported its end (between its commit and that report, version 2 is right).
            if run.killed, run.output.contains("migration-started"), !run.output.contains("migration-finished") {
                killedMidMigration += 1
                if version == 1 { rolledBack += 1 }
            }
            // The kernel released the dead child's lock.
            #expect(!DataDirectoryLock.isHeld(layout: layout))
        }
        // Proof that the test tested something: kills landed inside the migration, not only
        // before it began or after it ended, and some of them before its commit.
        #expect(killedMidMigration >= 3, "only \(killedMidMigration) of 24 kills landed during the migration")
        #expect(rolledBack >= 1, "no kill landed before a migration's commit")
        print("crash test: calibrated run \(window / 1000) ms; \(killedMidMigration) of 24 kills during the migration (\(rolledBack) before its commit); outcomes by version: \(outcomes.sorted { $0.key < $1.key })")

        // Whatever state the last kill left, the next open finishes the job.
        let harness = try Harness(directory: directory, migrations: try folder.load())
        #expect(try await harness.registry.info(user("victim")).schemaVersion == 2)
        await harness.registry.shutdown()
        try expectConsistent(storePath, allowed: [2], rewritesRows: rewritesRows)
    }

    private func restore(_ pristine: String, to path: String) {
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
        try! FileManager.default.copyItem(atPath: pristine, toPath: path)
    }

    /// Runs the helper; with `killAfter`, SIGKILLs it after that long (a random point in its
    /// run). Returns its exit status, the events it printed (flushed as they happened) and
    /// whether the SIGKILL ended it.
    private func runHelper(directory: TemporaryDirectory, folder: MigrationFolder, killAfter: Duration?) -> (status: Int32, output: String, killed: Bool) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: productsDirectory + "/userstore-test-helper")
        process.arguments = [directory.path + "/data", folder.path, "victim", "1.0"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try! process.run()
        if let killAfter {
            let deadline = ContinuousClock.now + killAfter
            while ContinuousClock.now < deadline, process.isRunning { usleep(200) }
            kill(process.processIdentifier, SIGKILL)
        }
        process.waitUntilExit()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let killed = process.terminationReason == .uncaughtSignal && process.terminationStatus == SIGKILL
        return (process.terminationStatus, printed, killed)
    }

    /// Opens the file as SQLite would after a crash and checks it; returns its version.
    @discardableResult
    private func expectConsistent(_ path: String, allowed: Set<Int64>, rewritesRows: Bool) throws -> Int64 {
        let queue = try DatabaseQueue(path: path)
        defer { try? queue.close() }
        return try queue.read { db in
            let version = try Int64.fetchOne(db, sql: "PRAGMA user_version")!
            #expect(allowed.contains(version))
            #expect(try String.fetchAll(db, sql: "PRAGMA integrity_check") == ["ok"])
            let snapshot = try BookkeepingSnapshot.read(db)
            #expect(snapshot.schemaVersion == version)
            #expect(snapshot.migrations == Array(1...version))
            let hasBig = try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'big')")!
            let baseSum = try Int.fetchOne(db, sql: "SELECT sum(x) FROM base")!
            if version == 1 {
                #expect(!hasBig)
                #expect(baseSum == 500_500)
            } else {
                #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM big") == Self.rows)
                #expect(baseSum == (rewritesRows ? 501_500 : 500_500))
            }
            return version
        }
    }
}
