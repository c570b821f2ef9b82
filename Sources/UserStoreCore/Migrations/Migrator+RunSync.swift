import GRDB

extension Migrator {
    /// How one migration run's commits reach the disk (``Durability``): one fsync for the whole
    /// run. Every commit before the last is written with `synchronous=NORMAL`, the last with
    /// FULL, whose fsync of the WAL covers the earlier frames too — or, with `.checkpoint`, all
    /// with NORMAL and the closing checkpoint's fsync covers them; with `.shared`, all with OFF
    /// and shared file-system syncs before and after the closing checkpoint. WAL commits stay
    /// atomic either way, so a power cut mid-run leaves the store at some earlier version, never
    /// in between.
    final class RunSync {
        private let db: Database
        private let durability: Durability
        private let user: UserID
        /// Commits the run will make.
        private let commits: Int
        private var committed = 0
        /// The connection's setting is NORMAL (or OFF) now; it is FULL otherwise (``StoreOpener``).
        private var relaxed = false
        private let relaxedSetting: String
        /// `.shared`: taken before the run's first write.
        private let mark: FileSystemSync.Mark?

        /// Before the run's first write.
        init(_ db: Database, durability: Durability, user: UserID, commits: Int) throws {
            self.db = db
            self.durability = durability
            self.user = user
            self.commits = commits
            relaxedSetting = if case .shared = durability { "PRAGMA synchronous = OFF" } else { "PRAGMA synchronous = NORMAL" }
            // `.shared`: nothing may reach the database file before the first shared sync. SQLite's
            // automatic checkpoint would, under synchronous=OFF, copy frames into it before the WAL
            // is synced, and the next commit could then restart the WAL over them: off for the run,
            // then back to SQLite's default, which is what every store `.shared` runs on has
            // (StoreOpener sets none; replicated stores, whose WALHook replaces it, never run it).
            if case .shared(let fileSystem) = durability {
                mark = fileSystem.mark()
                try db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
            } else {
                mark = nil
            }
        }

        /// Before each of the run's commits: sets the connection's sync for it (only when it
        /// changes: each PRAGMA is parsed anew).
        func beforeCommit() throws {
            committed += 1
            let wantsRelaxed = durability.defersSync || committed < commits
            guard relaxed != wantsRelaxed else { return }
            relaxed = wantsRelaxed
            try db.execute(sql: relaxed ? relaxedSetting : "PRAGMA synchronous = FULL")
        }

        /// After the run's last commit: a run whose commits deferred their sync is made durable
        /// (nothing for `.lastCommit`, or when nothing was committed).
        func makeDurable() throws {
            guard committed > 0 else { return }
            switch durability {
            case .lastCommit:
                return
            case .checkpoint:
                try checkpoint()
            case .shared(let fileSystem):
                guard let mark else { preconditionFailure("a .shared run takes its mark before its first write") }
                do {
                    try fileSystem.sync(since: mark) // the WAL, before the checkpoint overwrites database pages
                    try checkpoint()
                    try fileSystem.sync(since: mark) // the database file
                } catch let failure as FileSystemSync.Failure {
                    throw NotDurable(failure: .storageFailure(user: user, message: "\(failure): the migration's commits may not be on disk; the store is refused (check the disk, then the store: userstorectl verify)"))
                }
            }
        }

        /// Puts the connection's settings back (however the run ended).
        func end() {
            if relaxed { try? db.execute(sql: "PRAGMA synchronous = FULL") }
            if mark != nil { try? db.execute(sql: "PRAGMA wal_autocheckpoint = \(WALHook.checkpointPages)") }
        }

        /// Copies the WAL into the database file: what makes a `.checkpoint` run's commits durable
        /// (`synchronous=NORMAL` syncs the WAL and the database file around it; under `.shared`'s
        /// OFF it syncs nothing, and the shared syncs do). Throws if any frame is left behind,
        /// which exclusive locking rules out (no reader to wait for).
        private func checkpoint() throws {
            guard let row = try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(PASSIVE)") else { return }
            let busy: Int = row[0], frames: Int = row[1], copied: Int = row[2]
            guard busy == 0, copied == frames else {
                throw StoreError.storageFailure(user: user, message: "the checkpoint after migrating copied \(copied) of \(frames) WAL frames")
            }
        }
    }
}
