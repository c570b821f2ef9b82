import Foundation
import GRDB
import Synchronization
import Testing
@testable import UserStoreCore

@Suite struct RegistryClosingTests {
    /// Closing a set of users' stores (a bucket released, a writer lease lost) while one of them
    /// is still being opened: that store is closed too, once its open is done and its request
    /// refused — none stays open after `closeStores` returns. It used to look only at stores
    /// already open, and the one being opened stayed open on a host that had given its users up.
    @Test func closingStoresClosesOneStillBeingOpened() async throws {
        let directory = try TemporaryDirectory()
        let migrations = try MigrationFolder(directory).write("0001_notes.sql", "CREATE TABLE notes (title TEXT);").load()
        let placement = MovingAway()
        let harness = try Harness(directory: directory, migrations: migrations, placement: placement)
        _ = try await harness.registry.info(user("open"))

        // "late"'s open is held up inside its job, right after its file was created.
        let (inside, insideContinuation) = AsyncStream<Void>.makeStream()
        let letGo = DispatchSemaphore(value: 0)
        harness.recorder.onRecord.withLock {
            $0 = { event in
                guard case .storeCreated(let user, _, _) = event, user.rawValue == "late" else { return }
                insideContinuation.yield()
                letGo.wait()
            }
        }
        let late = Task { try await harness.registry.info(user("late")).schemaVersion }
        for await _ in inside { break }
        // Their bucket starts moving: new requests are refused, then the stores closed.
        placement.moving.withLock { $0 = true }

        // closeStores looks at the entries once, at its start: "late" is let go only after that.
        let (looked, lookedContinuation) = AsyncStream<Void>.makeStream()
        async let closed = harness.registry.closeStores { _ in
            lookedContinuation.yield()
            return true
        }
        for await _ in looked { break }
        letGo.signal()

        // The request that opened it is asked about again once the open is done: refused.
        await #expect(throws: StoreError.self) { try await late.value }
        #expect(await closed == 2)
        #expect(harness.registry.statistics.openStores == 0, "a store being opened stayed open")
    }

    /// More stores than are closed at a time: every one is closed, and counted.
    @Test func closingStoresClosesThemAllSeveralAtATime() async throws {
        let directory = try TemporaryDirectory()
        let migrations = try MigrationFolder(directory).write("0001_notes.sql", "CREATE TABLE notes (title TEXT);").load()
        let harness = try Harness(directory: directory, migrations: migrations)
        let count = StoreRegistry.closingWidth * 2 + 5
        for index in 0..<count { _ = try await harness.registry.info(user("user\(index)")) }
        #expect(await harness.registry.closeStores { $0.rawValue != "user0" } == count - 1)
        #expect(harness.registry.statistics.openStores == 1)
        await harness.registry.shutdown()
        #expect(harness.registry.statistics.openStores == 0)
    }

    /// Admits every user until `moving`, then none (a bucket moving to another host).
    final class MovingAway: StorePlacement {
        let moving = Mutex(false)
        func admit(_ user: UserID) throws(StoreError) {
            if moving.withLock({ $0 }) { throw .clusterUnavailable(user: user, message: "the bucket is moving") }
        }
    }
}
