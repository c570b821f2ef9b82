import Foundation
import GRDB
import Testing
@testable import UserStoreCore

@Suite struct CohortTests {
    /// Computed independently (Python's hashlib): a user's place must never change between
    /// builds, hosts or runs, or a step would reach other users than the one before it.
    @Test func placesAreTheFirstEightBytesOfSHA256ModuloTenThousand() {
        #expect(Cohort.position(of: user("alice")) == 207)
        #expect(Cohort.position(of: user("bob")) == 8650)
        #expect(Cohort.position(of: user("user-7")) == 2581)
    }

    @Test func aStepReachesItsShareAndEveryCanary() {
        let users = (0..<10_000).map { user("user-\($0)") }
        let reached = users.filter { Cohort.contains($0, percent: 10, canary: []) }.count
        #expect((900...1100).contains(reached))
        #expect(Cohort.contains(user("bob"), percent: 0, canary: ["bob"]))
        #expect(!Cohort.contains(user("bob"), percent: 50, canary: []))
        #expect(Cohort.contains(user("alice"), percent: 2.08, canary: []) && !Cohort.contains(user("alice"), percent: 2.07, canary: []))
        // A larger step reaches everyone a smaller one reached.
        #expect(users.allSatisfy { !Cohort.contains($0, percent: 10, canary: []) || Cohort.contains($0, percent: 50, canary: []) })
    }
}

@Suite struct RolloutPolicyTests {
    @Test func parsesStepsDurationsAndPercentages() throws {
        #expect(try RolloutPolicy.parseSteps("1%,10%,50%,100%") == [1, 10, 50, 100])
        #expect(try RolloutPolicy.parseSteps("0.5, 100") == [0.5, 100])
        #expect(RolloutPolicy.parseDuration("10m") == 600 && RolloutPolicy.parseDuration("90") == 90 && RolloutPolicy.parseDuration("2h") == 7200)
        #expect(RolloutPolicy.parseDuration("ten") == nil && RolloutPolicy.parseDuration("-1s") == nil)
        #expect(RolloutPolicy.parsePercent("1%") == 1 && RolloutPolicy.parsePercent("x%") == nil)
    }

    @Test func refusesStepsThatDoNotGrowToAHundred() {
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy(steps: [10, 50]) }
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy(steps: [50, 10, 100]) }
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy(steps: [0, 100]) }
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy(steps: [100], canary: ["not a user/"]) }
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy(steps: [100], haltOn: 2) }
        #expect(throws: RolloutPolicyError.self) { try RolloutPolicy.parseSteps("10%,,100%") }
    }
}

@Suite struct ReleaseTests {
    let start = Date(timeIntervalSince1970: 1_700_000_000)

    private func staged(steps: [Double] = [10, 100], canary: [String] = [], wait: Int = 60, haltOn: Double = 0.2) throws -> Release {
        let baseline = Release.baseline(versions: [1, 2], fingerprint: "a", now: start)
        return baseline.successor(versions: [1, 2, 3], fingerprint: "b", policy: try RolloutPolicy(steps: steps, canary: canary, waitSeconds: wait, haltOn: haltOn), now: start)
    }

    @Test func aBaselineHoldsNothingBackAndCannotBeStarted() throws {
        var release = Release.baseline(versions: [1, 2], fingerprint: "a", now: start)
        #expect(release.state == .none && release.allowedVersions(for: user("bob")) == nil)
        #expect(throws: ReleaseError.noRelease) { try release.start(try RolloutPolicy(steps: [100]), now: start) }
        let unstaged = release.successor(versions: [1, 2, 3], fingerprint: "b", policy: nil, now: start)
        #expect(unstaged.state == .running && unstaged.step == 100 && unstaged.newVersions == [3])
        #expect(unstaged.allowedVersions(for: user("bob")) == nil && !unstaged.servesFailedStores)
    }

    /// A reload whose versions add nothing to the ones a release would build on (a migration
    /// removed) starts no release, whatever the state before.
    @Test func versionsThatAddNothingStartNoRelease() throws {
        let baseline = Release.baseline(versions: [1, 2, 3], fingerprint: "a", now: start)
        let removed = baseline.successor(versions: [1, 2], fingerprint: "b", policy: try RolloutPolicy(steps: [100]), now: start)
        #expect(removed.state == .none && removed.versions == [1, 2] && removed.baseVersions == [1, 2] && removed.fingerprint == "b")
        let running = try staged(steps: [10, 100], canary: [])
        let withdrawn = running.successor(versions: [1, 2], fingerprint: "c", policy: nil, now: start)
        #expect(withdrawn.state == .none && withdrawn.newVersions.isEmpty)
        #expect(running.successor(versions: [1, 2, 4], fingerprint: "d", policy: nil, now: start).state == .running)
    }

    @Test func onlyTheCurrentStepsCohortAndTheCanariesMigrate() throws {
        var release = try staged(steps: [10, 100], canary: ["bob"])
        #expect(release.step == 0 && release.servesFailedStores)
        #expect(release.allowedVersions(for: user("bob")) == nil)          // the canary
        #expect(release.allowedVersions(for: user("alice")) == [1, 2])     // place 207: not at 0%
        let early = try release.advance(now: start.addingTimeInterval(59))
        let due = try release.advance(now: start.addingTimeInterval(60))
        #expect(!early && due)
        #expect(release.step == 10 && release.allowedVersions(for: user("alice")) == nil)
        #expect(release.allowedVersions(for: user("user-7")) == [1, 2])    // place 2581
        let completedEarly = release.completeIfDone(everyStoreAtVersion: true) // not at the last step yet
        let forced = try release.advance(now: start, force: true)
        let beyond = try release.advance(now: start, force: true)               // no step after 100%
        #expect(!completedEarly && forced && !beyond)
        let completed = release.completeIfDone(everyStoreAtVersion: true)
        #expect(completed && release.state == .complete)
        #expect(release.allowedVersions(for: user("user-7")) == nil)
    }

    @Test func haltsOncePastTheThresholdAndResumesWithoutItsFailures() throws {
        var release = try staged(haltOn: 0.2)
        let first = release.recordFailure(user("a"), error: "boom", storesReached: 10)   // 10%
        let second = release.recordFailure(user("b"), error: "boom", storesReached: 10)  // 20%: not past it
        let third = release.recordFailure(user("c"), error: "boom", storesReached: 10)   // 30%
        #expect(!first && !second && third)
        #expect(release.state == .halted && release.haltReason?.contains("3 of 10 stores") == true)
        #expect(release.allowedVersions(for: user("alice")) == [1, 2])   // alice was reached; nothing migrates now
        let late = release.recordFailure(user("d"), error: "late", storesReached: 10)
        #expect(!late && release.failures.count == 3)
        #expect(throws: ReleaseError.notAllowed(state: .halted, action: "advance")) { try release.advance(now: start, force: true) }
        try release.resume(now: start)
        #expect(release.state == .running && release.failures.isEmpty && release.allowedVersions(for: user("alice")) == nil)
        #expect(throws: ReleaseError.notAllowed(state: .running, action: "resume")) { try release.resume(now: start) }
    }

    @Test func anAbortNeedsEveryDownAndHoldsEveryStoreAtTheBase() throws {
        var release = try staged()
        #expect(throws: ReleaseError.irreversible(["0003_x.sql"])) { try release.abort(missingDown: ["0003_x.sql"]) }
        #expect(release.state == .running)
        try release.abort(missingDown: [])
        #expect(release.state == .aborted && release.allowedVersions(for: user("alice")) == [1, 2])
        // The next release builds on the versions before the aborted one, not on its own.
        let next = release.successor(versions: [1, 2, 4], fingerprint: "c", policy: nil, now: start)
        #expect(next.baseVersions == [1, 2] && next.newVersions == [4])
        try release.start(try RolloutPolicy(steps: [100]), now: start)
        #expect(release.state == .running && release.allowedVersions(for: user("alice")) == nil)
    }

    @Test func survivesARoundTripThroughJSON() throws {
        var release = try staged(canary: ["bob"])
        _ = release.recordFailure(user("a"), error: "boom", storesReached: 100)
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        #expect(try decoder.decode(Release.self, from: encoder.encode(release)) == release)
    }
}

/// The registry under a gate: a held store is served at the version it has, a held new store
/// is created at the versions before the release, everyone else migrates.
@Suite struct GatedRegistryTests {
    struct HoldBack: MigrationGate {
        let users: Set<String>
        func allowedVersions(for user: UserID) -> Set<Int64>? { users.contains(user.rawValue) ? [1, 2] : nil }
    }

    private func migrations(_ directory: TemporaryDirectory, third: Bool) throws -> MigrationSet {
        var folder = try MigrationFolder(directory)
            .write("0001_notes.sql", "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);")
            .write("0002_tags.sql", "CREATE TABLE tags (name TEXT);")
        if third { folder = try folder.write("0003_archive.sql", "ALTER TABLE notes ADD COLUMN archived INTEGER NOT NULL DEFAULT 0;") }
        return try folder.load()
    }

    @Test func heldStoresStayAtTheirVersionAndNewOnesStartBeforeTheRelease() async throws {
        let directory = try TemporaryDirectory()
        try await Harness.seed([user("held"), user("free")], in: directory, migrations: try migrations(directory, third: false))
        let harness = try Harness(directory: directory, migrations: try migrations(directory, third: true),
                                  gate: HoldBack(users: ["held", "newheld"]))
        #expect(try await harness.registry.info(user("held")).schemaVersion == 2)
        #expect(try await harness.registry.info(user("free")).schemaVersion == 3)
        #expect(try await harness.registry.info(user("newheld")).schemaVersion == 2)
        #expect(try await harness.registry.info(user("newfree")).schemaVersion == 3)
        let plan = try await harness.registry.plan(user("held"))
        #expect(plan.steps.isEmpty && plan.heldVersions == [3])
        let outcome = await harness.registry.fleet.migrate(user("held"), dryRun: false)
        #expect(outcome.state == .held && outcome.toVersion == 2)
        #expect(await harness.registry.fleet.migrate(user("newheld"), dryRun: true).state == .held)
        // The held store keeps the app version it recorded: it is not at this release.
        let recorded = try await harness.registry.withStore(user("held")) { store in
            try await store.read { try String.fetchOne($0, sql: "SELECT app_version FROM app_version") }
        }
        #expect(recorded == "1.0.0")
        await harness.registry.shutdown()
    }
}
