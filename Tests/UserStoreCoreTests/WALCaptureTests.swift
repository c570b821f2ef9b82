import Crypto
import Foundation
import GRDB
import GRDBSQLite
import Testing
@testable import UserStoreCore

/// ``WALCapture``: each commit's pages, read out of the WAL by the WAL hook, replayed in order on
/// a copy of the database as it was when capture began, give the live database back — row for
/// row (``StoreDigest``) and byte for byte once the live one is checkpointed — after thousands of
/// mixed transactions: inserts, updates and deletes of rows and blobs, indexes and tables made
/// and dropped, rollbacks, savepoints rolled back to, transactions larger than the page cache
/// (spilled to the WAL before they commit, some of them rolled back, some writing spilled pages
/// again before they commit), VACUUM, and WAL
/// restarts after TRUNCATE and PASSIVE checkpoints.
struct WALCaptureTests {
    /// A small deterministic generator (xorshift64*), so that a failing run can be repeated.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state ^= state >> 12
            state ^= state << 25
            state ^= state >> 27
            return state &* 2_685_821_657_736_338_717
        }
        mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
    }

    /// The commits captured, applied one after another to `file`.
    final class Replay: @unchecked Sendable { // touched only on the database's queue, read after it
        let file: String
        var commits = 0
        var restarts = 0
        var failures: [String] = []
        /// Whether a captured page held a title in plaintext ("small …").
        var sawPlaintext = false
        private var lastSalt: WALCapture.Salt?

        init(file: String) { self.file = file }

        func apply(_ result: Result<WALCapture.Commit, WALCapture.Failure>) {
            switch result {
            case .failure(let failure):
                failures.append(failure.description)
            case .success(let commit):
                if let lastSalt, lastSalt != commit.salt { restarts += 1 }
                lastSalt = commit.salt
                commits += 1
                let descriptor = open(file, O_WRONLY)
                defer { close(descriptor) }
                for page in commit.pages {
                    if !sawPlaintext, Data(page.data).range(of: Data("small ".utf8)) != nil { sawPlaintext = true }
                    let written = page.data.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, page.data.count, off_t(Int(page.number - 1) * commit.pageSize)) }
                    if written != page.data.count { failures.append("writing page \(page.number) of the replay failed") }
                }
                ftruncate(descriptor, off_t(Int(commit.databasePages) * commit.pageSize))
            }
        }
    }

    /// The digest of the database at `path`, read through `cipher` when it is encrypted.
    static func digest(_ path: String, cipher: PageCipher?) throws -> StoreDigest {
        guard let cipher else { return try StoreDigest.read(path: path) }
        var configuration = Configuration()
        configuration.prepareDatabase { db in try cipher.install(on: db.sqliteConnection!) }
        return try DatabaseQueue(path: path, configuration: configuration).read { try StoreDigest.read($0.sqliteConnection!) }
    }

    /// Encrypted (``PageCipher``): the captured pages are ciphertext, and replayed they give
    /// the live database back as well (read with the same key).
    @Test(arguments: [(UInt64(0x5eed_0001), false), (0x5eed_0002, false), (0x5eed_0003, true)])
    func replayingTheCapturedCommitsGivesTheLiveDatabaseBack(seed: UInt64, encrypted: Bool) throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/live.sqlite"
        let replay = Replay(file: directory.path + "/replay.sqlite")
        let hook = WALHook()
        #expect(PageCipher.layerRegistered)
        let cipher = encrypted ? PageCipher(dataKey: SymmetricKey(size: .bits256)) : nil
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try cipher?.install(on: db.sqliteConnection!)
            // A small page cache: transactions of a few hundred rows spill to the WAL before
            // they commit.
            try db.execute(sql: "PRAGMA cache_size = 20")
            hook.install(on: db.sqliteConnection!)
        }
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body BLOB)")
            // The state capture begins from: the database file with everything checkpointed.
            try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
        try FileManager.default.copyItem(atPath: path, toPath: replay.file)
        let capture = WALCapture(databasePath: path, deliver: replay.apply)
        try capture.resumeAfterCurrentContents()
        hook.capture = capture

        var random = Random(state: seed)
        var tables = ["notes"]
        for step in 0..<3000 {
            let table = tables[random.below(tables.count)]
            try queue.writeWithoutTransaction { db in
                switch random.below(20) {
                case 0...5:
                    try db.execute(sql: "INSERT INTO \(table) (title, body) VALUES (?, randomblob(?))", arguments: ["t\(step)", random.below(600)])
                case 6...7:
                    try db.execute(sql: "UPDATE \(table) SET title = title || 'x', body = randomblob(?) WHERE id % 7 = ?", arguments: [random.below(3000), random.below(7)])
                case 8:
                    try db.execute(sql: "DELETE FROM \(table) WHERE id % 11 = ?", arguments: [random.below(11)])
                case 9:
                    // Larger than the page cache: spilled to the WAL before the commit.
                    try db.inTransaction {
                        try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) INSERT INTO \(table) (title, body) SELECT 'bulk', randomblob(300) FROM n",
                                       arguments: [200 + random.below(400)])
                        return .commit
                    }
                case 10:
                    // Spilled too, then rolled back: its frames must never be taken for a commit.
                    try db.inTransaction {
                        try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO \(table) (title, body) SELECT 'gone', randomblob(400) FROM n")
                        return .rollback
                    }
                case 11:
                    try db.inTransaction {
                        try db.execute(sql: "INSERT INTO \(table) (title) VALUES ('kept')")
                        try db.execute(sql: "SAVEPOINT s")
                        try db.execute(sql: "INSERT INTO \(table) (title, body) VALUES ('undone', randomblob(2000))")
                        try db.execute(sql: "ROLLBACK TO s")
                        try db.execute(sql: "RELEASE s")
                        return .commit
                    }
                case 12:
                    let name = "t\(step)"
                    try db.execute(sql: "CREATE TABLE \(name) (id INTEGER PRIMARY KEY, title TEXT, body BLOB)")
                    try db.execute(sql: "CREATE INDEX \(name)_title ON \(name) (title)")
                    tables.append(name)
                case 13 where tables.count > 2:
                    let name = tables.remove(at: 1 + random.below(tables.count - 1))
                    try db.execute(sql: "DROP TABLE \(name)")
                case 14:
                    try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
                case 15:
                    // Everything copied into the database, the WAL left as it is: the next
                    // commit restarts it from frame 1 under a new salt, over older frames.
                    try db.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)")
                case 16 where step % 500 == 16:
                    try db.execute(sql: "VACUUM")
                case 17:
                    // Spilled, then written again in the same transaction: a page's later frame
                    // must win over the one spilled first.
                    try db.inTransaction {
                        try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) INSERT INTO \(table) (title, body) SELECT 'again', randomblob(300) FROM n")
                        try db.execute(sql: "UPDATE \(table) SET body = randomblob(300), title = 'rewritten' WHERE title = 'again'")
                        return .commit
                    }
                default:
                    try db.execute(sql: "INSERT INTO notes (title) VALUES (?)", arguments: ["small \(step)"])
                }
            }
        }
        #expect(replay.failures.isEmpty, "\(replay.failures.prefix(3))")
        #expect(replay.commits > 2500 && replay.restarts > 100, "\(replay.commits) commits, \(replay.restarts) WAL restarts")
        #expect(replay.sawPlaintext == !encrypted)

        let live = try Self.digest(path, cipher: cipher)
        let replayed = try Self.digest(replay.file, cipher: cipher)
        #expect(live.differences(from: replayed).isEmpty, "\(live.differences(from: replayed).prefix(5))")
        // Byte for byte, once the live database holds everything in its own file (not when
        // encrypted: a checkpoint writes each page under a new nonce).
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try queue.close()
        if !encrypted { #expect(FileManager.default.contents(atPath: path) == FileManager.default.contents(atPath: replay.file)) }
    }

    /// Capture that begins on a WAL already holding commits (a store reopened after a crash)
    /// starts after the last commit frame of the header's salt: older frames past a restart and
    /// a rolled-back transaction's spilled frames are not taken for commits.
    @Test func resumingSkipsWhatTheWALHeldAndStopsAtItsLastCommit() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/live.sqlite"
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA cache_size = 20")
            sqlite3_wal_autocheckpoint(db.sqliteConnection!, 0)
        }
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, body BLOB)")
            for _ in 0..<20 { try db.execute(sql: "INSERT INTO notes (body) VALUES (randomblob(3000))") }
            try db.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)")
            // Restarted under a new salt: 3 commits over the older frames.
            for _ in 0..<3 { try db.execute(sql: "INSERT INTO notes (body) VALUES (randomblob(10))") }
            // Spilled frames past the last commit.
            try db.inTransaction {
                try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO notes (body) SELECT randomblob(400) FROM n")
                return .rollback
            }
        }
        var lastCommitFrame: Int32 = 0
        queue.writeWithoutTransaction { db in
            var log: Int32 = 0, checkpointed: Int32 = 0
            // A zero-page "checkpoint" that copies nothing: it only reports the WAL's frame count.
            sqlite3_wal_checkpoint_v2(db.sqliteConnection!, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &checkpointed)
            lastCommitFrame = log
        }
        let capture = WALCapture(databasePath: path) { _ in }
        let position = try capture.resumeAfterCurrentContents()
        #expect(position.salt != nil && position.frames == UInt32(lastCommitFrame) && lastCommitFrame > 0, "\(position), SQLite: \(lastCommitFrame)")
        try queue.close()
    }
}
