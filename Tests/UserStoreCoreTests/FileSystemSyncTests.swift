import Dispatch
import Foundation
import Synchronization
import CSyncFS
import Testing
@testable import UserStoreCore

/// The group commit of fleet runs (``FileSystemSync``): one `syncfs` serves every caller
/// waiting, but never one that began before the caller asked, and its failure reaches them all.
@Suite struct FileSystemSyncTests {
    /// A caller that arrives while a sync runs cannot count on it (it may have begun before the
    /// caller's writes): it must wait for the next one. The first sync is held half-way until
    /// the second caller waits; without the rule, that caller returns when the first ends and
    /// no second sync ever starts.
    @Test func aCallerArrivingDuringASyncWaitsForTheNextOne() throws {
        let directory = try TemporaryDirectory()
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let calls = Atomic(0)
        let sync = FileSystemSync(directory: directory.path) { descriptor in
            calls.add(1, ordering: .relaxed)
            entered.signal()
            release.wait()
            return syncfs(descriptor)
        }
        let done = DispatchGroup()
        let returned = Mutex<[String]>([])
        DispatchQueue.global().async(group: done) { try? sync.sync(); returned.withLock { $0.append("first") } }
        #expect(entered.wait(timeout: .now() + 10) == .success, "the first caller runs a sync")

        DispatchQueue.global().async(group: done) { try? sync.sync(); returned.withLock { $0.append("second") } }
        let deadline = Date().addingTimeInterval(10)
        while sync.statistics.waiting < 1, Date() < deadline { Thread.sleep(forTimeInterval: 0.001) } // polls a condition; the test does not depend on its timing
        #expect(sync.statistics.waiting == 1, "the second caller waits while the first sync runs")

        release.signal() // the first sync ends
        #expect(entered.wait(timeout: .now() + 10) == .success, "a second sync starts for the caller that arrived during the first")
        #expect(calls.load(ordering: .relaxed) == 2)
        release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(returned.withLock { $0 } == ["first", "second"])
        #expect(sync.statistics.syncs == 2)
    }

    /// Callers that arrive together share syncs: never more syncs than callers, and every
    /// caller returns.
    @Test func manyCallersShareTheirSyncs() throws {
        let directory = try TemporaryDirectory()
        let sync = FileSystemSync(directory: directory.path)
        let callers = 32
        let failures = Atomic(0)
        DispatchQueue.concurrentPerform(iterations: callers) { _ in
            do { try sync.sync() } catch { failures.add(1, ordering: .relaxed) }
        }
        #expect(failures.load(ordering: .relaxed) == 0)
        let syncs = sync.statistics.syncs
        #expect(syncs >= 1 && syncs <= UInt64(callers), "\(syncs) syncs for \(callers) callers")
    }

    /// A sync that fails (here: the folder is gone) is an error for every caller that waited
    /// for it, naming the folder and the reason.
    @Test func aFailedSyncIsAnErrorForEveryCallerThatWaitedForIt() throws {
        let directory = try TemporaryDirectory()
        let sync = FileSystemSync(directory: directory.path + "/missing")
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            do { try sync.sync() } catch { failures.withLock { $0.append("\(error)") } }
        }
        let messages = failures.withLock { $0 }
        #expect(messages.count == 8)
        #expect(messages.allSatisfy { $0.contains("/missing") && $0.contains("No such file or directory") }, "\(messages)")
    }

    /// A write-back error reported by one sync fails its callers, and a later caller whose
    /// sync succeeds is not failed by it.
    @Test func aWriteBackErrorFailsOnlyTheCallersOfThatSync() throws {
        let directory = try TemporaryDirectory()
        let results = Mutex<[Int32]>([-1, 0])
        let sync = FileSystemSync(directory: directory.path) { _ in
            results.withLock { results in
                let result = results.removeFirst()
                if result != 0 { errno = EIO }
                return result
            }
        }
        #expect(throws: FileSystemSync.Failure.self) { try sync.sync() }
        #expect(throws: Never.self) { try sync.sync() }
    }
}
