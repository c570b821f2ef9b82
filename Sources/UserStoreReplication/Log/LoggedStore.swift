import Foundation
import GRDB
import Synchronization
import UserStoreCore

/// One open store replicated through the host log: its capture, where its stream stands, and the
/// number of its last record in the log (what a durable write waits for).
///
/// Records come from the store's connection (the WAL hook), in commit order: a commit record for
/// each commit, or — when the store's position in the replica is not known (a new store at its
/// first commit, a file changed out of capture's sight, a capture or append that failed) — a base
/// (every page of the database file) and the WAL's commits as one record, which start a new
/// stream. The position beside the store is written only once what it claims is stored.
package final class LoggedStore: Sendable {
    package let store: Store
    package let user: UserID
    /// The epoch the store replicates under (the writer lease's), carried by every record.
    package let epoch: Int64
    /// The user's cluster bucket (nil with one host).
    package let bucket: UInt16?
    let capture: WALCapture
    private let uploader: LogUploader

    private struct State {
        var stream: UInt64
        var txid: UInt64
        /// The number of the store's last record in the log (0: none since it opened).
        var lastRecord: UInt64 = 0
        /// A base must go out before the next commit record (and nothing counts as replicated).
        var needsBase: Bool
        /// Why, while it does.
        var problem: String?
        /// Positions made so far and the one last saved beside the store (the newest wins).
        var positions = 0
        var savedPosition = 0
        var closed = false
    }

    private let state: Mutex<State>
    /// Held across each write of the position file with the check that allows it (and while
    /// the store is marked closed): an older save never lands after a newer position — a
    /// pending one before a base above all, or the old stream would be continued after it.
    private let positionFile = Mutex<Void>(())
    /// A checkpoint waits for the store's records (``checkpointOnceStored()``): one at a time.
    private let checkpointWaiting = Atomic<Bool>(false)

    /// The store, replicated from `position` on (nil: a base goes out, now or at its first commit).
    init(store: Store, epoch: Int64, bucket: UInt16?, uploader: LogUploader, position: LogPosition?) {
        self.store = store
        user = store.user
        self.epoch = epoch
        self.bucket = bucket
        self.uploader = uploader
        state = Mutex(State(stream: position?.stream ?? 0, txid: position?.txid ?? 0, needsBase: position == nil))
        capture = WALCapture(databasePath: store.path)
        capture.deliver = { [weak self] result in self?.committed(result) }
    }

    /// The number of the store's last record, or why the store does not count as replicated.
    package var lastRecord: Result<UInt64, Unreplicated> {
        state.withLock { state in
            state.needsBase ? .failure(Unreplicated(description: state.problem ?? "its base has not gone out yet")) : .success(state.lastRecord)
        }
    }

    /// Why a store's last commits are not in the log.
    package struct Unreplicated: Error, CustomStringConvertible, Sendable {
        package let description: String
    }

    /// Whether the store needs a base.
    package var needsBase: Bool { state.withLock { $0.needsBase } }

    // MARK: Records

    /// A commit the capture read (on the store's connection).
    func committed(_ result: Result<WALCapture.Commit, WALCapture.Failure>) {
        if state.withLock({ $0.needsBase }) {
            // Whatever this commit holds is in the base's WAL record.
            shipBase()
            return
        }
        switch result {
        case .failure(let failure):
            fail("capturing a commit: \(failure)")
            shipBase()
        case .success(let commit):
            let (txid, since, stream) = state.withLock { state -> (UInt64, UInt64, UInt64) in
                let since = state.txid
                state.txid += UInt64(max(commit.commits, 1))
                return (state.txid, since, state.stream)
            }
            let record = LogRecord(kind: .commit, user: user.rawValue, bucket: bucket, epoch: epoch, stream: stream, txid: txid, since: since,
                                   pageSize: UInt32(commit.pageSize), databasePages: commit.databasePages, pages: commit.pages)
            guard let number = uploader.append(record) else {
                fail("the log's uploader holds too much already (the replica has been away long): the store ships whole once it is back")
                return
            }
            state.withLock { $0.lastRecord = number }
        }
    }

    /// Ships the store whole: a base (every page of the database file) and the WAL's commits as
    /// one record, starting a new stream; the position is saved beside the store once they are
    /// stored. On the store's connection, or before anything writes to it.
    func shipBase() {
        let stream = UInt64.random(in: 1...UInt64.max)
        do {
            // The old stream's position goes first (and no save of it still waiting may land):
            // after a crash the store ships a base again rather than continue the old stream,
            // and the epoch its file is written under is known.
            try positionFile.withLock { _ in
                state.withLock { $0.positions += 1 }
                try LogPosition.shipping(stream: stream, epoch: epoch, beside: store.path)
            }
            let (pageSize, pages) = try Self.readDatabaseFile(store.path)
            let wal = try capture.contentsAsOneCommit()
            let base = LogRecord(kind: .base, user: user.rawValue, bucket: bucket, epoch: epoch, stream: stream, txid: 0, since: 0,
                                 pageSize: UInt32(wal?.pageSize ?? pageSize), databasePages: UInt32(pages.count), pages: pages)
            guard var number = uploader.append(base) else {
                fail("the log's uploader holds too much already: the store ships whole once the replica is back")
                return
            }
            var txid: UInt64 = 0
            if let wal {
                txid = UInt64(wal.commits)
                let record = LogRecord(kind: .commit, user: user.rawValue, bucket: bucket, epoch: epoch, stream: stream, txid: txid, since: 0,
                                       pageSize: UInt32(wal.pageSize), databasePages: wal.databasePages, pages: wal.pages)
                guard let walNumber = uploader.append(record) else {
                    fail("the log's uploader holds too much already: the store ships whole once the replica is back")
                    return
                }
                number = walNumber
            }
            let position = LogPosition(stream: stream, epoch: epoch, txid: 0, salt: wal?.salt, frames: 0)
            let generation = state.withLock { state -> Int in
                state.stream = stream
                state.txid = txid
                state.lastRecord = number
                state.needsBase = false
                state.problem = nil
                state.positions += 1
                return state.positions
            }
            savePositionOnceStored(position, through: number, generation: generation)
        } catch {
            fail("reading the store for its base: \(error)")
        }
    }

    /// The store's position after one of its own checkpoints (the WAL is empty, every record of
    /// it stored): saved at once.
    func checkpointed() {
        let (position, generation) = state.withLock { state -> (LogPosition, Int) in
            state.positions += 1
            return (LogPosition(stream: state.stream, epoch: epoch, txid: state.txid, salt: nil, frames: 0), state.positions)
        }
        save(position, generation: generation)
    }

    /// Whether the store may checkpoint now: every record of it is stored, none waits.
    func mayCheckpoint() -> Bool {
        let (last, needsBase) = state.withLock { ($0.lastRecord, $0.needsBase) }
        return !needsBase && uploader.isStored(last)
    }

    /// How long a checkpoint the WAL hook could not run waits for the store's records to be
    /// stored (the replica may be away) before it gives up; the next commit past the bound asks
    /// again.
    static let checkpointWait: Duration = .seconds(30)
    /// How long the checkpoint then holds the store, in its turn, for the records committed
    /// meanwhile: the store's own requests wait at most that long (as a rule, one upload).
    static let checkpointHold: Duration = .seconds(2)

    /// The WAL is past ``WALHook/checkpointPages`` and the hook could not empty it, its last
    /// records not stored yet (on the connection: never blocks). Once they are, a checkpoint is
    /// queued in the store's turn (``checkpointInTurn(_:)``). Without it a store written without
    /// pause would never empty its WAL: right after each commit its record is still uploading.
    func checkpointOnceStored() {
        guard !checkpointWaiting.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let uploader = self.uploader
        Task {
            guard case .success(let last) = lastRecord, await uploader.waitUntilStored(last, until: .now + Self.checkpointWait) else {
                checkpointWaiting.store(false, ordering: .releasing)
                return
            }
            // Queued only while the store is open: once it is closing (``close()``, after its
            // queued work finished) the connection may be gone by the time work would run.
            state.withLock { state in
                guard !state.closed else { return checkpointWaiting.store(false, ordering: .releasing) }
                store.enqueue({ [self] db in checkpointInTurn(db) }, completion: { [self] _ in checkpointWaiting.store(false, ordering: .releasing) })
            }
        }
    }

    /// Empties the WAL in the store's turn, nothing else running on it: first waits (at most
    /// ``checkpointHold``) for the records committed since the checkpoint was asked for.
    private func checkpointInTurn(_ db: Database) {
        guard case .success(let last) = lastRecord else { return }
        guard uploader.isStored(last) || uploader.waitOnThisThread(for: last, until: .now + Self.checkpointHold) else { return }
        // The first column is 1 when the checkpoint could not finish (busy): tried again later.
        guard mayCheckpoint(), (try? Int.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")) == 0 else { return }
        checkpointed()
    }

    /// Nothing more is recorded (the store is closing, or the lease was lost).
    func close() {
        positionFile.withLock { _ in state.withLock { $0.closed = true } }
    }

    /// The store's position in the replica is lost (`problem` says why): a base goes out next.
    func fail(_ problem: String) {
        state.withLock { state in
            state.needsBase = true
            state.problem = problem
        }
    }

    private func savePositionOnceStored(_ position: LogPosition, through number: UInt64, generation: Int) {
        let uploader = self.uploader
        Task {
            // A minute at a time, until stored or superseded by a newer position: a wait's timer
            // keeps its memory until its deadline even once the wait is over (Task.sleep's), so
            // a day-long deadline held ~140 bytes for a day for every base shipped.
            while await !uploader.waitUntilStored(number, until: .now + .seconds(60)) {
                if state.withLock({ $0.positions != generation }) { return }
            }
            // Not once the store closed: its closing saves what is true then, and a store
            // opened again has positions of its own, which this one must not overwrite.
            await BlockingPool.run { self.save(position, generation: generation, unlessClosed: true) }
        }
    }

    private func save(_ position: LogPosition, generation: Int, unlessClosed: Bool = false) {
        positionFile.withLock { _ in
            let newest = state.withLock { state -> Bool in
                // Only the newest position made: an older one (a base's, stored after a newer
                // base began) would point at a stream no longer continued.
                guard generation == state.positions, generation > state.savedPosition, !(unlessClosed && state.closed) else { return false }
                state.savedPosition = generation
                return true
            }
            if newest { try? position.save(beside: store.path) }
        }
    }

    /// The database file's page size and its pages, as they are on disk (the state before the
    /// WAL's frames).
    static func readDatabaseFile(_ path: String) throws -> (pageSize: Int, pages: [WALCapture.Page]) {
        let bytes = [UInt8]((try? Data(contentsOf: URL(fileURLWithPath: path))) ?? Data())
        guard bytes.count >= 100 else { return (4096, []) }
        let raw = Int(bytes[16]) << 8 | Int(bytes[17])
        let pageSize = raw == 1 ? 65536 : raw
        guard pageSize >= 512, bytes.count % pageSize == 0 else {
            throw LogSegment.Damaged(description: "\(path) is not a SQLite database of whole pages (page size \(pageSize), \(bytes.count) bytes)")
        }
        let pages = (0..<bytes.count / pageSize).map { index in
            WALCapture.Page(number: UInt32(index + 1), data: Array(bytes[index * pageSize..<(index + 1) * pageSize]))
        }
        return (pageSize, pages)
    }
}
