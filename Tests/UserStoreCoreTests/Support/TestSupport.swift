import Foundation
import GRDB
import Synchronization
@testable import UserStoreCore

/// A temporary directory removed when the value is deinitialised.
final class TemporaryDirectory: Sendable {
    let path: String

    init() throws {
        let template = NSTemporaryDirectory() + "userstore-test-XXXXXX"
        var bytes = Array(template.utf8CString)
        guard mkdtemp(&bytes) != nil else { throw CocoaError(.fileWriteUnknown) }
        path = String(decoding: bytes.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }

    /// A sub-path, its folder created.
    func folder(_ name: String) throws -> String {
        let folder = path + "/" + name
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        return folder
    }
}

/// Writes migration files into a folder.
struct MigrationFolder {
    let path: String

    init(_ directory: TemporaryDirectory, name: String = "migrations") throws {
        path = try directory.folder(name)
    }

    @discardableResult
    func write(_ fileName: String, _ contents: String) throws -> MigrationFolder {
        try contents.write(toFile: path + "/" + fileName, atomically: true, encoding: .utf8)
        return self
    }

    func remove(_ fileName: String) throws {
        try FileManager.default.removeItem(atPath: path + "/" + fileName)
    }

    func load() throws -> MigrationSet {
        try MigrationSet.load(directory: path)
    }
}

/// Collects events, thread-safely.
final class EventRecorder: StoreObserver {
    private let storage = Mutex<[StoreEvent]>([])
    /// Called with each event after it is recorded, on the thread that records it (a test may
    /// hold up the store's open there).
    let onRecord = Mutex<(@Sendable (StoreEvent) -> Void)?>(nil)

    func record(_ event: StoreEvent) {
        storage.withLock { $0.append(event) }
        onRecord.withLock { $0 }?(event)
    }

    var events: [StoreEvent] { storage.withLock { $0 } }

    func count(where predicate: (StoreEvent) -> Bool) -> Int { events.filter(predicate).count }
}

/// A data directory with its lock and a registry over it.
struct Harness {
    let directory: TemporaryDirectory
    let layout: StoreLayout
    let lock: DataDirectoryLock
    let registry: StoreRegistry
    let recorder: EventRecorder

    init(directory: TemporaryDirectory, migrations: MigrationSet, appVersion: String = "1.0.0", maxOpenStores: Int = 64,
         policy: MigrationPolicy = MigrationPolicy(), idleTimeout: Duration = .seconds(300), fleetSync: FileSystemSync? = nil,
         gate: (any MigrationGate)? = nil, placement: (any StorePlacement)? = nil) throws {
        self.directory = directory
        layout = StoreLayout(dataDirectory: directory.path + "/data")
        lock = try DataDirectoryLock(layout: layout)
        recorder = EventRecorder()
        registry = StoreRegistry(
            configuration: RegistryConfiguration(layout: layout, appVersion: try AppVersion(appVersion), maxOpenStores: maxOpenStores,
                                                 idleTimeout: idleTimeout, policy: policy),
            migrations: migrations, lock: lock, observer: recorder, replication: nil, placement: placement, fleetSync: fleetSync, gate: gate)
    }

    /// Creates `users`' stores at `migrations` through a registry of their own, then closes
    /// them: a data directory for a test to start from.
    static func seed(_ users: [UserID], in directory: TemporaryDirectory, migrations: MigrationSet) async throws {
        let harness = try Harness(directory: directory, migrations: migrations)
        for id in users { _ = try await harness.registry.info(id) }
        await harness.registry.shutdown()
    }

    /// Opens `user`'s file directly (not through the registry) to inspect it.
    func inspect<T>(_ user: String, _ body: (Database) throws -> T) throws -> T {
        let queue = try DatabaseQueue(path: layout.storePath(for: try UserID(user)))
        defer { try? queue.close() }
        return try queue.read(body)
    }
}

func user(_ id: String) -> UserID { try! UserID(id) }

/// Bookkeeping of a store as plain values, for exact comparisons.
struct BookkeepingSnapshot: Equatable {
    var userVersion: Int64
    var schemaVersion: Int64
    var appVersion: String
    var createdBy: String
    var migrations: [Int64]
    var names: [String]

    static func read(_ db: Database) throws -> BookkeepingSnapshot {
        let row = try Row.fetchOne(db, sql: "SELECT schema_version, app_version, created_by_app_version FROM app_version")!
        return BookkeepingSnapshot(
            userVersion: try Int64.fetchOne(db, sql: "PRAGMA user_version")!,
            schemaVersion: row[0], appVersion: row[1], createdBy: row[2],
            migrations: try Int64.fetchAll(db, sql: "SELECT version FROM schema_migrations ORDER BY version"),
            names: try String.fetchAll(db, sql: "SELECT name FROM schema_migrations ORDER BY version"))
    }
}

/// The notes-app example used across tests: the repo's own config/migrations.
var exampleMigrationsDirectory: String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("config/migrations").path
}

/// Directory of the built products (the test bundle sits beside the executables).
var productsDirectory: String {
    URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        .deletingLastPathComponent().path
}
