import Foundation
import GRDB
import GRDBSQLite
#if canImport(Glibc)
import Glibc
#endif

/// Where the file of an import comes from.
public enum ImportSource: Sendable {
    /// A descriptor the caller passed (read from its current offset to the end; never written).
    case descriptor(Int32)
    /// A path the daemon can read itself (with its `-wal`, if one is beside it).
    case path(String)
}

/// What an import did.
public struct ImportReport: Sendable, Equatable {
    /// The schema version the store starts at; the next request migrates it from there.
    public var schemaVersion: Int64
    /// The file already carried userstore's bookkeeping (an export), which was kept.
    public var keptBookkeeping: Bool
    /// An existing store was replaced; its copy is at `backup`.
    public var replaced: Bool
    public var backup: String?
}

/// Turns an existing SQLite file into a store, in the staging folder: copied (the source is
/// never modified), checked with `integrity_check`, switched to WAL, given userstore's
/// bookkeeping at a schema version (rows in `schema_migrations` for every configured migration up
/// to it, marked `imported`), synced. ``StoreFiles/publish(_:as:)`` then puts it in place.
struct StoreImporter {
    let user: UserID
    let migrations: MigrationSet
    let appVersion: AppVersion

    /// Why an import is refused (the file is left alone and nothing of the store changes).
    func refused(_ reason: String) -> StoreError { .importRefused(user: user, reason: reason) }

    /// Copies `source` to `staged` (and a `-wal` beside a path source, so SQLite recovers it).
    func copy(_ source: ImportSource, to staged: String) throws {
        switch source {
        case .descriptor(let descriptor):
            try copyBytes(from: descriptor, to: staged)
        case .path(let path):
            let descriptor = open(path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else { throw refused("cannot open \(path): \(String(cString: strerror(errno)))") }
            defer { close(descriptor) }
            try copyBytes(from: descriptor, to: staged)
            let wal = open(path + "-wal", O_RDONLY | O_CLOEXEC)
            if wal >= 0 {
                defer { close(wal) }
                try copyBytes(from: wal, to: staged + "-wal")
            }
        }
    }

    private func copyBytes(from source: Int32, to path: String) throws {
        var info = stat()
        guard fstat(source, &info) == 0 else { throw refused("cannot read the file: \(String(cString: strerror(errno)))") }
        guard info.st_mode & S_IFMT == S_IFREG else { throw refused("not a regular file") }
        let target = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard target >= 0 else { throw StoreError.storageFailure(user: user, message: "cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(target) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw refused("cannot read the file: \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            var written = 0
            while written < count {
                let step = buffer.withUnsafeBytes { write(target, $0.baseAddress! + written, count - written) }
                guard step > 0 else { throw StoreError.storageFailure(user: user, message: "cannot write \(path): \(String(cString: strerror(errno)))") }
                written += step
            }
        }
    }

    /// Checks and converts the copy at `staged` in place; returns the schema version it is at.
    /// `requested`: the caller's schema version (needed when the file has neither userstore's
    /// bookkeeping nor a non-zero `user_version`).
    func prepare(_ staged: String, requested: Int64?) throws -> (schemaVersion: Int64, keptBookkeeping: Bool) {
        var configuration = Configuration()
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE") }
        let queue: DatabaseQueue
        do {
            queue = try DatabaseQueue(path: staged, configuration: configuration)
        } catch let error as DatabaseError {
            throw refused("not a SQLite database (\(error.message ?? "\(error.resultCode)"))")
        }
        defer { try? queue.close() }
        do {
            return try queue.writeWithoutTransaction { db in
                let integrity = try String.fetchAll(db, sql: "PRAGMA integrity_check")
                guard integrity == ["ok"] else { throw refused("integrity_check: " + integrity.prefix(3).joined(separator: "; ")) }
                let (version, kept) = try schemaVersion(db, requested: requested)
                guard try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")?.lowercased() == "wal" else {
                    throw refused("cannot switch the file to WAL")
                }
                if !kept { try addBookkeeping(db, version: version) }
                try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
                return (version, kept)
            }
        } catch let error as StoreError {
            throw error
        } catch let error as DatabaseError {
            switch error.resultCode {
            case .SQLITE_NOTADB, .SQLITE_CORRUPT: throw refused("damaged: \(error.message ?? "\(error.resultCode)")")
            default: throw StoreError.storageFailure(user: user, message: "preparing the import: \(error.message ?? "\(error.resultCode)")")
            }
        }
    }

    /// The version the store starts at: its userstore bookkeeping's, the caller's, or a
    /// non-zero `user_version`; refused when none says.
    private func schemaVersion(_ db: Database, requested: Int64?) throws -> (Int64, kept: Bool) {
        let latest = migrations.latestVersion
        if try Bookkeeping.exists(db) {
            guard let info = try Bookkeeping.read(db) else { throw refused("the app_version table has no row") }
            if let requested, requested != info.schemaVersion {
                throw refused("the file's userstore bookkeeping says schema version \(info.schemaVersion), not \(requested)")
            }
            guard info.schemaVersion <= latest else { throw refused("schema version \(info.schemaVersion) is newer than the latest known migration \(latest)") }
            return (info.schemaVersion, true)
        }
        let userVersion = try Bookkeeping.userVersion(db)
        guard let version = requested ?? (userVersion > 0 ? userVersion : nil) else {
            throw refused("the file has no userstore bookkeeping and PRAGMA user_version is 0: give the schema version (the last migration its schema already has; 0 for none): schemaVersion in ImportStore, --schema-version with userstorectl import")
        }
        guard version >= 0 else { throw refused("schemaVersion must be 0 or more") }
        guard version <= latest else { throw refused("schema version \(version) is newer than the latest known migration \(latest)") }
        let known = migrations.migrations.map(\.version)
        guard version == 0 || known.contains(version) else {
            throw refused("schema version \(version) is not the version of a migration (known: \(known.map(String.init).joined(separator: ", ")))")
        }
        return (version, false)
    }

    /// userstore's bookkeeping at `version`: every configured migration up to it is recorded as
    /// applied (marked `imported`), with today's checksums.
    private func addBookkeeping(_ db: Database, version: Int64) throws {
        try db.inTransaction {
            try Bookkeeping.initialise(db, appVersion: appVersion, createdBy: "imported")
            for migration in migrations.migrations where migration.version <= version {
                try Bookkeeping.recordImported(db, migration)
            }
            _ = try Bookkeeping.syncVersion(db, appVersion: appVersion)
            return .commit
        }
    }
}
