import CSyncFS
import Dispatch
import Foundation
import Synchronization
import Testing
@testable import UserStoreCore

/// The group commit of fleet runs (``FileSystemSync``): one `syncfs` serves every caller
/// waiting, but never one that began before the caller asked, and a failure reaches every
/// caller that had written meanwhile.
@Suite struct FileSystemSyncTests {
    /// A `syncfs` the test holds half-way: `entered` is signalled as each sync starts, and each
    /// waits for one `release`; `results` (0 or -1 with EIO) are returned in turn, 0 after.
    final class HeldSync: Sendable {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let calls = Atomic(0)
        let results: Mutex<[Int32]>

        init(results: [Int32] = []) { self.results = Mutex(results) }

        func run(_ descriptor: Int32) -> Int32 {
            calls.add(1, ordering: .relaxed)
            entered.signal()
            release.wait()
            let result = results.withLock { $0.isEmpty ? syncfs(descriptor) : $0.removeFirst() }
            if result != 0 { errno = EIO }
            return result
        }
    }

    /// Waits until `count` callers wait for a sync someone else runs (a condition, polled; the
    /// outcome does not depend on how long it takes).
    private func waitUntil(_ sync: FileSystemSync, waiting count: Int) -> Bool {
        let deadline = Date().addingTimeInterval(10)
        while sync.statistics.waiting < count, Date() < deadline { Thread.sleep(forTimeInterval: 0.001) }
        return sync.statistics.waiting == count
    }

    /// A caller that arrives while a sync runs cannot count on it (it may have begun before the
    /// caller's writes): it must wait for the next one. The first sync is held half-way until
    /// the second caller waits; without the rule, that caller returns when the first ends and
    /// no second sync ever starts.
    @Test func aCallerArrivingDuringASyncWaitsForTheNextOne() throws {
        let directory = try TemporaryDirectory()
        let held = HeldSync()
        let sync = FileSystemSync(directory: directory.path, syncFileSystem: held.run)
        let done = DispatchGroup()
        let returned = Mutex<Set<String>>([])
        DispatchQueue.global().async(group: done) { if (try? sync.sync(since: sync.mark())) != nil { returned.withLock { _ = $0.insert("first") } } }
        #expect(held.entered.wait(timeout: .now() + 10) == .success, "the first caller runs a sync")

        DispatchQueue.global().async(group: done) { if (try? sync.sync(since: sync.mark())) != nil { returned.withLock { _ = $0.insert("second") } } }
        #expect(waitUntil(sync, waiting: 1), "the second caller waits while the first sync runs")

        held.release.signal() // the first sync ends
        #expect(held.entered.wait(timeout: .now() + 10) == .success, "a second sync starts for the caller that arrived during the first")
        #expect(held.calls.load(ordering: .relaxed) == 2)
        held.release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(returned.withLock { $0 } == ["first", "second"])
        #expect(sync.statistics.syncs == 2)
    }

    /// Callers that arrive while a sync runs share the next one: 1 sync for the first caller,
    /// 1 for the 15 that waited meanwhile (one each without sharing).
    @Test func callersWaitingTogetherShareOneSync() throws {
        let directory = try TemporaryDirectory()
        let held = HeldSync()
        let sync = FileSystemSync(directory: directory.path, syncFileSystem: held.run)
        let done = DispatchGroup()
        let failures = Atomic(0)
        DispatchQueue.global().async(group: done) { do { try sync.sync(since: sync.mark()) } catch { failures.add(1, ordering: .relaxed) } }
        #expect(held.entered.wait(timeout: .now() + 10) == .success)
        for _ in 0..<15 {
            done.enter()
            Thread(block: { do { try sync.sync(since: sync.mark()) } catch { failures.add(1, ordering: .relaxed) }; done.leave() }).start()
        }
        #expect(waitUntil(sync, waiting: 15))
        held.release.signal() // the first sync
        #expect(held.entered.wait(timeout: .now() + 10) == .success, "one more sync for the 15 waiting")
        held.release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(failures.load(ordering: .relaxed) == 0)
        #expect(sync.statistics.syncs == 2 && held.calls.load(ordering: .relaxed) == 2)
    }

    /// A write-back error is reported to one sync, whoever's data it was: every caller that had
    /// marked before it finished fails — the one that ran it and those that waited for the
    /// next sync (which itself succeeds) — and a caller that marks afterwards does not.
    @Test func aFailedSyncFailsEveryCallerThatHadWrittenMeanwhile() throws {
        let directory = try TemporaryDirectory()
        let held = HeldSync(results: [-1, 0])
        let sync = FileSystemSync(directory: directory.path, syncFileSystem: held.run)
        let done = DispatchGroup()
        let messages = Mutex<[String]>([])
        func caller() {
            let mark = sync.mark()
            DispatchQueue.global().async(group: done) {
                do { try sync.sync(since: mark) } catch { messages.withLock { $0.append("\(error)") } }
            }
        }
        caller()
        #expect(held.entered.wait(timeout: .now() + 10) == .success)
        for _ in 0..<3 { caller() }
        #expect(waitUntil(sync, waiting: 3))
        held.release.signal() // the first sync fails
        #expect(held.entered.wait(timeout: .now() + 10) == .success)
        held.release.signal() // the second succeeds
        #expect(done.wait(timeout: .now() + 10) == .success)
        let failed = messages.withLock { $0 }
        #expect(failed.count == 4, "\(failed)")
        #expect(failed.allSatisfy { $0.contains("syncfs of \(directory.path)") && $0.contains("Input/output error") }, "\(failed)")

        let later = sync.mark()
        held.release.signal() // lets the next sync through at once
        #expect(throws: Never.self) { try sync.sync(since: later) }
    }

    /// A folder that cannot be opened makes every sync fail, naming it and the reason.
    @Test func aFolderThatCannotBeOpenedFailsEverySync() throws {
        let directory = try TemporaryDirectory()
        let sync = FileSystemSync(directory: directory.path + "/missing")
        #expect {
            try sync.sync(since: sync.mark())
        } throws: { error in
            "\(error)".contains("/missing") && "\(error)".contains("No such file or directory")
        }
    }

    /// The kernels this runs on (Debian 12: 6.1) report write-back errors through syncfs.
    @Test func thisKernelReportsWriteBackErrorsThroughSyncfs() {
        #expect(FileSystemSync.reportsWriteBackErrors)
    }

    /// A path is covered when it — or, while it does not exist, its nearest existing folder —
    /// is on the synced directory's file system; /proc never is.
    @Test func coversOnlyWhatIsOnItsFileSystem() throws {
        let directory = try TemporaryDirectory()
        let fileSystem = FileSystemSync(directory: directory.path)
        #expect(fileSystem.covers(directory.path))
        #expect(fileSystem.covers(directory.path + "/stores/ab/cd/not-yet.sqlite"))
        #expect(!fileSystem.covers("/proc/self/status"))
        #expect(!fileSystem.covers("/proc/no-such-file"))
    }
}
