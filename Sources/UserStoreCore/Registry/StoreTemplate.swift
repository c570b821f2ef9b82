import Foundation
import GRDB

/// An empty store migrated once for one migration set; new stores start as a byte copy of it
/// (``MigrationPolicy/newStoresFromTemplate``).
///
/// Migrating a new store costs a write transaction per migration (and one fsync for the run);
/// copying the template costs one file write and two fsyncs (the file and its folder) whatever the
/// number of migrations (the creation time is stamped without one: `Bookkeeping.stampCreation`).
struct StoreTemplate: Sendable {
    /// The registry generation (migration set) it was built for.
    let generation: Int
    /// The file's bytes: a complete database in WAL mode, with no WAL of its own.
    let bytes: [UInt8]
    let schemaVersion: Int64
    /// Versions applied while building it, ascending.
    let applied: [Int64]

    /// Migrates a fresh scratch file in `layout.templatesDirectory` with `migrator` exactly as
    /// a new store would be, keeps its bytes and deletes the file.
    static func build(generation: Int, migrator: Migrator, layout: StoreLayout) throws -> StoreTemplate {
        let directory = layout.templatesDirectory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = directory + "/build-\(getpid())-\(generation).sqlite"
        let remove = { for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) } }
        remove()
        defer { remove() }
        let queue = try DatabaseQueue(path: path)
        let report = try queue.writeWithoutTransaction { db in try migrator.migrate(db, created: true) }
        try queue.close() // checkpoints the WAL into the file and deletes it
        guard let data = FileManager.default.contents(atPath: path) else {
            throw StoreError.storageFailure(user: migrator.user, message: "cannot read the template built at \(path)")
        }
        return StoreTemplate(generation: generation, bytes: Array(data), schemaVersion: report.toVersion, applied: report.applied)
    }

    /// Writes a copy to `path`, durably and atomically (``DurableFile``): a crash leaves either
    /// no store or the whole copy.
    func install(at path: String, user: UserID) throws {
        let temporary = path + ".new" // not `.sqlite`: never mistaken for a store
        let fail = { (reason: String) -> StoreError in .storageFailure(user: user, message: "creating the store from the template: \(reason)") }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw fail(DurableFile.Failure("open", temporary).description) }
        var written = 0
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard count > 0 else {
                let failure = DurableFile.Failure("write", temporary)
                close(fd)
                unlink(temporary)
                throw fail(failure.description)
            }
            written += count
        }
        close(fd)
        do {
            try DurableFile.publish(temporary, as: path)
        } catch {
            throw fail(error.description)
        }
    }
}
