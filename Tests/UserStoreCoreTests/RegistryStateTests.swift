import Testing
@testable import UserStoreCore

/// The registry's transitions (``RegistryState``) driven directly, without files or SQLite:
/// which store a request gets, what is opened, brought up to date, evicted or refused.
struct RegistryStateTests {
    /// A store as the state sees it.
    final class StandIn: RegistryStore {
        let damaged: String?
        init(damaged: String? = nil) { self.damaged = damaged }
    }

    typealias State = RegistryState<StandIn>

    /// The state, and what its transitions asked for.
    struct Driver: ~Copyable {
        var state: State
        var preparations: [String] = []
        var refusals: [StoreError] = []

        init() throws {
            state = State(migrations: try MigrationSet([]), rules: .init(maxOpenStores: 2, servePreviousVersionOnFailure: false))
        }

        mutating func request(_ name: String, access: StoreRegistry.Access = .client, mode: StoreRegistry.LeaseMode = .migrate,
                              exists: Bool = true) throws -> State.LeaseStep {
            var asked: [String] = [], refused: [StoreError] = []
            let step = state.nextStep(for: try UserID(name), access: access, mode: mode, exists: exists,
                                      refused: { refused.append($0) }, prepare: { _, preparation in
                switch preparation {
                case .bringUpToDate: asked.append("bring \(name) up to date")
                case .open(let migrate): asked.append(migrate ? "open and migrate \(name)" : "open \(name) as it is")
                }
                return Task { .prepared(nil) }
            })
            preparations += asked
            refusals += refused
            return step
        }

        /// `name`'s store opened and ready at the current generation, leased by nobody.
        mutating func ready(_ name: String, damaged: String? = nil) throws -> StandIn {
            let store = StandIn(damaged: damaged)
            guard case .wait = try request(name) else { throw Unexpected() }
            state.prepared(try UserID(name), store: store, phase: .ready(state.generation), migrated: true)
            return store
        }
    }

    struct Unexpected: Error {}

    @Test func aNewStoreIsOpenedOnceAndEveryRequestWaitsForThatOnePreparation() throws {
        var driver = try Driver()
        guard case .wait(let first) = try driver.request("ann"), case .wait(let second) = try driver.request("ann") else {
            Issue.record("a new store's requests do not wait for its preparation")
            return
        }
        #expect(first == second)
        #expect(driver.preparations == ["open and migrate ann"])
        #expect(driver.state.holding == 1)
    }

    @Test func aFullRegistryEvictsTheLeastRecentlyUsedIdleStore() throws {
        var driver = try Driver()
        let ann = try driver.ready("ann"), bob = try driver.ready("bob")
        // ann is used after bob: bob is the least recently used.
        guard case .use(let leased, nil) = try driver.request("ann") else { Issue.record("ann not served"); return }
        #expect(leased === ann)
        _ = driver.state.release(try UserID("ann"))
        guard case .evict(let victim) = try driver.request("cat") else { Issue.record("nothing evicted for cat"); return }
        #expect(victim === bob)
        #expect(driver.state.entries[try UserID("bob")] == nil)
        #expect(driver.state.holding == 2, "the evicted store's slot is freed once it is closed")
        driver.state.closed(try UserID("bob"))
        guard case .wait = try driver.request("cat") else { Issue.record("cat not opened after the eviction"); return }
        #expect(driver.preparations.last == "open and migrate cat")
    }

    /// A store taken out to be closed (evicted here; idle, or after a fleet job's look, alike)
    /// is not opened again until it is closed: a second connection beside the closing one
    /// waited for SQLite's lock and failed with "database is locked" when the close outlasted
    /// the busy time-out.
    @Test func aRequestForAStoreBeingClosedWaitsForTheCloseBeforeOpeningItAgain() throws {
        var driver = try Driver()
        _ = try driver.ready("ann")
        _ = try driver.ready("bob")
        guard case .evict = try driver.request("cat") else { Issue.record("nothing evicted for cat"); return }
        guard case .waitForClose = try driver.request("ann") else { Issue.record("ann opened again while it is being closed"); return }
        #expect(driver.preparations == ["open and migrate ann", "open and migrate bob"])
        driver.state.closed(try UserID("ann"))
        #expect(driver.state.closing.isEmpty)
        guard case .wait = try driver.request("ann") else { Issue.record("ann not opened once closed"); return }
        #expect(driver.preparations.last == "open and migrate ann")
    }

    @Test func whenEveryOpenStoreIsInUseARequestWaitsForCapacity() throws {
        var driver = try Driver()
        driver.state.rules.maxOpenStores = 1
        let ann = try driver.ready("ann")
        guard case .use = try driver.request("ann") else { Issue.record("ann not served"); return }
        guard case .waitForCapacity = try driver.request("bob") else { Issue.record("bob did not wait for capacity"); return }
        _ = driver.state.release(try UserID("ann"))
        guard case .evict(let victim) = try driver.request("bob") else { Issue.record("ann not evicted once released"); return }
        #expect(victim === ann)
    }

    @Test func aStoreOpenedUnderOlderMigrationsIsBroughtUpToDateBeforeUse() throws {
        var driver = try Driver()
        _ = try driver.ready("ann")
        driver.state.generation += 1 // a reload
        guard case .wait = try driver.request("ann") else { Issue.record("an out-of-date store was served as it is"); return }
        #expect(driver.preparations.last == "bring ann up to date")
    }

    @Test func aFailedMigrationIsRefusedToClientsUnlessThePreviousVersionIsServed() throws {
        var driver = try Driver()
        let ann = try driver.ready("ann")
        let failure = StoreError.migrationFailed(user: try UserID("ann"), version: 2, migration: "0002_x.sql", message: "no",
                                                 sqliteCode: nil, schemaVersion: 1)
        driver.state.prepared(try UserID("ann"), store: ann, phase: .failed(failure, driver.state.generation), migrated: false)
        guard case .fail(let refused) = try driver.request("ann") else { Issue.record("a failed store was served to a client"); return }
        #expect(refused.description == failure.description)
        guard case .use(let store, let reported?) = try driver.request("ann", access: .admin) else { Issue.record("admin refused"); return }
        #expect(store === ann && reported.description == failure.description)
        driver.state.rules.servePreviousVersionOnFailure = true
        guard case .use(_, _?) = try driver.request("ann") else { Issue.record("the previous version was not served"); return }
    }

    @Test func aStoreFoundDamagedIsRefusedFromThenOnEvenOnceClosed() throws {
        var driver = try Driver()
        _ = try driver.ready("ann", damaged: "database disk image is malformed")
        guard case .fail(.storeDamaged) = try driver.request("ann") else { Issue.record("a damaged store was served"); return }
        #expect(driver.refusals.count == 1)
        guard case .use(_, .storeDamaged?) = try driver.request("ann", access: .admin) else { Issue.record("admin refused"); return }
        _ = driver.state.release(try UserID("ann"))
        #expect(driver.state.removeForClosing(try UserID("ann")) != nil)
        driver.state.freeSlots(1)
        // Closed: still refused to clients and to migrations; an administrator may open it as it is.
        guard case .fail(.storeDamaged) = try driver.request("ann") else { Issue.record("a closed damaged store was reopened"); return }
        guard case .fail(.storeDamaged) = try driver.request("ann", access: .admin) else { Issue.record("a damaged store was migrated"); return }
        guard case .wait = try driver.request("ann", access: .admin, mode: .asIs) else { Issue.record("admin could not open it as it is"); return }
        #expect(driver.preparations.last == "open ann as it is")
    }

    @Test func theFastPathLeasesOnlyAReadyUpToDateSoundStoreAndCountsItsLeases() throws {
        var driver = try Driver()
        let ann = try driver.ready("ann"), annID = try UserID("ann")
        #expect(driver.state.leaseIfReady(try UserID("bob")) == nil, "a store that is not open was leased")
        let before = driver.state.tick
        #expect(driver.state.leaseIfReady(annID) === ann)
        #expect(driver.state.leaseIfReady(annID) === ann)
        #expect(driver.state.entries[annID]?.leases == 2)
        #expect(driver.state.tick == before + 2, "a lease does not mark the store as recently used")
        _ = driver.state.release(annID)
        _ = driver.state.release(annID)
        #expect(driver.state.entries[annID]?.leases == 0)
        #expect(driver.state.entries[annID]?.isIdle == true)

        driver.state.generation += 1 // a reload: the slow path brings it up to date first
        #expect(driver.state.leaseIfReady(annID) == nil)
        #expect(driver.state.entries[annID]?.leases == 0, "a refused fast-path lease was counted")
        #expect(driver.state.tick == before + 2)

        _ = try driver.ready("cat", damaged: "database disk image is malformed")
        #expect(driver.state.leaseIfReady(try UserID("cat")) == nil, "a damaged store was leased")
    }
}
