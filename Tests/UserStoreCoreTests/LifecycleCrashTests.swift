import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// A child process is SIGKILLed at random moments of a delete, an import and a restore; after
/// the start-up recovery the store must be either the old one or the new one, whole.
@Suite(.serialized) struct LifecycleCrashTests {
    /// Rows of padding, so that copying the store takes long enough to be interrupted.
    static let rows = 150_000

    struct Setup {
        let directory: TemporaryDirectory
        let folder: MigrationFolder
        let layout: StoreLayout
        let store: String
        /// A copy of the data directory to reset from before each run.
        let pristine: String
    }

    /// A data directory whose store for `victim` holds a `tag` row saying `old` (and a manual
    /// backup of it when `withBackup`, after which the live store says `current`).
    func makeSetup(withBackup: Bool) async throws -> Setup {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory).write("0001_base.sql", """
            CREATE TABLE tag (value TEXT NOT NULL);
            INSERT INTO tag VALUES ('old');
            CREATE TABLE padding (id INTEGER PRIMARY KEY, payload TEXT NOT NULL);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(Self.rows))
            INSERT INTO padding (id, payload) SELECT i, hex(randomblob(32)) FROM n;
            """)
        let harness = try Harness(directory: directory, migrations: try folder.load())
        _ = try await harness.registry.info(user("victim"))
        if withBackup {
            _ = try await harness.registry.backup(user("victim"))
            try await harness.registry.withStore(user("victim")) { store in
                try await store.write { db in try db.execute(sql: "UPDATE tag SET value = 'current'") }
            }
        }
        await harness.registry.shutdown()
        let layout = StoreLayout(dataDirectory: directory.path + "/data")
        let pristine = directory.path + "/pristine"
        try FileManager.default.copyItem(atPath: layout.dataDirectory, toPath: pristine)
        return Setup(directory: directory, folder: folder, layout: layout, store: layout.storePath(for: user("victim")), pristine: pristine)
    }

    func reset(_ setup: Setup) {
        try? FileManager.default.removeItem(atPath: setup.layout.dataDirectory)
        try! FileManager.default.copyItem(atPath: setup.pristine, toPath: setup.layout.dataDirectory)
    }

    /// The store's tag after the recovery a restart runs; nil when the store is gone.
    func stateAfterRecovery(_ setup: Setup) throws -> String? {
        _ = try StoreFiles(layout: setup.layout).recoverInterruptedOperations()
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: setup.layout.stagingDirectory)) ?? []).isEmpty)
        guard FileManager.default.fileExists(atPath: setup.store) else {
            #expect(!FileManager.default.fileExists(atPath: setup.store + "-wal"))
            return nil
        }
        let queue = try DatabaseQueue(path: setup.store)
        defer { try? queue.close() }
        return try queue.read { db in
            #expect(try String.fetchAll(db, sql: "PRAGMA integrity_check") == ["ok"])
            #expect(try Int.fetchOne(db, sql: "SELECT count(*) FROM padding") == Self.rows)
            return try String.fetchOne(db, sql: "SELECT value FROM tag")
        }
    }

    /// How a run of the helper ended.
    struct HelperRun {
        /// Its exit status (or the signal that ended it).
        let status: Int32
        /// SIGKILLed after it said the operation began and before it said the operation was
        /// done: the kill landed mid-operation.
        let killedMidOperation: Bool
        /// From the operation's start to the helper's end.
        let operationTime: Duration
    }

    /// Runs the helper with `operation`; with `killAfter`, SIGKILLs it that long after it says
    /// the operation began.
    func runHelper(_ setup: Setup, _ operation: [String], killAfter: Duration?) -> HelperRun {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: productsDirectory + "/userstore-test-helper")
        process.arguments = [setup.layout.dataDirectory, setup.folder.path, "victim", "1.0"] + operation
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try! process.run()
        let reader = output.fileHandleForReading
        var said = ""
        while !said.contains("started\n") { // blocks on the pipe until the helper says so (or ends)
            let data = reader.availableData
            if data.isEmpty { break }
            said += String(decoding: data, as: UTF8.self)
        }
        let started = ContinuousClock.now
        if let killAfter {
            let deadline = started + killAfter
            while ContinuousClock.now < deadline, process.isRunning { usleep(200) } // the kill's moment, not a wait for a state
            kill(process.processIdentifier, SIGKILL)
        }
        process.waitUntilExit()
        let operationTime = ContinuousClock.now - started
        said += String(decoding: reader.readDataToEndOfFile(), as: UTF8.self)
        let killed = process.terminationReason == .uncaughtSignal && process.terminationStatus == SIGKILL
        return HelperRun(status: process.terminationStatus, killedMidOperation: killed && said.contains("started\n") && !said.contains("done"),
                         operationTime: operationTime)
    }

    /// Kills `operation` at random points of its run; every outcome must be in `allowed`, and
    /// most kills must land while the operation runs (else the loop proves nothing).
    func crashLoop(_ setup: Setup, _ operation: [String], allowed: Set<String?>, finished: String?,
                   check: (String?) -> Void = { _ in }) throws {
        reset(setup)
        let calibration = runHelper(setup, operation, killAfter: nil)
        #expect(calibration.status == 0)
        let end = try stateAfterRecovery(setup)
        #expect(end == finished)
        check(end)
        func microseconds(_ duration: Duration) -> Int64 {
            duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000
        }
        var window = microseconds(calibration.operationTime)
        var outcomes: [String: Int] = [:]
        var midOperation = 0
        // 16 runs, and more (up to 48) until a quarter of 16 kills landed mid-operation.
        let runs = 16, wanted = runs / 4
        var done = 0
        while done < runs || (midOperation < wanted && done < 3 * runs) {
            done += 1
            reset(setup)
            let run = runHelper(setup, operation, killAfter: .microseconds(Int64.random(in: 0...window)))
            if run.killedMidOperation { midOperation += 1 }
            // An operation that finished before its kill ran shorter than the window: kills
            // are drawn over its time from then on (a loaded machine's calibration runs long).
            if run.status == 0 { window = min(window, microseconds(run.operationTime)) }
            let state = try stateAfterRecovery(setup)
            #expect(allowed.contains(state), "\(operation): \(state ?? "no store")")
            check(state)
            outcomes[state ?? "gone", default: 0] += 1
            #expect(!DataDirectoryLock.isHeld(layout: setup.layout))
        }
        // Kills drawn over the operation's time land in it most of the time; on a loaded machine
        // an operation's time varies by more than itself (a 50 ms delete: 2 of 16 kills landed
        // in a busy full run), so the loop goes on until a quarter of 16 have.
        #expect(midOperation >= wanted, "only \(midOperation) of \(done) kills landed while \(operation.first!) ran")
        print("lifecycle crash test \(operation.first!): operation window \(window / 1000) ms; \(midOperation) of \(done) kills mid-operation; outcomes \(outcomes.sorted { $0.key < $1.key })")
    }

    @Test(.timeLimit(.minutes(10)))
    func sigkillDuringDeleteLeavesTheStoreWholeOrGone() async throws {
        let setup = try await makeSetup(withBackup: true)
        // Gone means gone, backups too; a store still there has all its backups.
        try crashLoop(setup, ["delete"], allowed: ["current", nil], finished: nil) { state in
            #expect(BackupKeeper(layout: setup.layout).backups(of: user("victim")).count == (state == nil ? 0 : 1))
        }
    }

    @Test(.timeLimit(.minutes(10)))
    func sigkillDuringImportLeavesTheOldStoreOrTheNew() async throws {
        let setup = try await makeSetup(withBackup: false)
        // The file to import: the store itself with another tag.
        let source = setup.directory.path + "/import.sqlite"
        try FileManager.default.copyItem(atPath: setup.store, toPath: source)
        let queue = try DatabaseQueue(path: source)
        try await queue.write { db in try db.execute(sql: "UPDATE tag SET value = 'imported'") }
        try queue.close()
        try crashLoop(setup, ["import", source], allowed: ["old", "imported"], finished: "imported")
    }

    @Test(.timeLimit(.minutes(10)))
    func sigkillDuringRestoreLeavesTheStoreOrItsBackup() async throws {
        let setup = try await makeSetup(withBackup: true)
        let backup = try #require(BackupKeeper(layout: setup.layout).backups(of: user("victim")).first)
        #expect(backup.reason == .manual)
        try crashLoop(setup, ["restore", backup.fileName], allowed: ["current", "old"], finished: "old")
    }
}
