// A child process for the crash tests: takes the data directory's lock, opens one user's store
// through a registry (which migrates it) and prints each store event on its own line, flushed,
// so the parent knows when a migration is under way before it sends SIGKILL. With an
// operation, runs that instead of opening the store (the lifecycle crash tests), and prints
// "started" as it begins it and "done ..." once it finished.
//
//   userstore-test-helper DATA_DIR MIGRATIONS_DIR USER APP_VERSION [delete | import FILE | restore BACKUP]
import Foundation
import UserStoreCore

struct LineObserver: StoreObserver {
    func record(_ event: StoreEvent) {
        let name: String
        switch event {
        case .migrationStarted: name = "migration-started"
        case .migrationStep(_, let version, _, _, _, _, _): name = "step \(version)"
        case .migrationFinished: name = "migration-finished"
        case .backupCreated: name = "backup-created"
        case .storeCreated: name = "store-created"
        case .migrationFailed(_, let error): name = "failed \(error)"
        default: name = "event"
        }
        FileHandle.standardOutput.write(Data((name + "\n").utf8))
    }
}

let arguments = CommandLine.arguments
guard (5...7).contains(arguments.count) else {
    FileHandle.standardError.write(Data("usage: userstore-test-helper DATA_DIR MIGRATIONS_DIR USER APP_VERSION [delete | import FILE | restore BACKUP]\n".utf8))
    exit(2)
}
do {
    let layout = StoreLayout(dataDirectory: arguments[1])
    let lock = try DataDirectoryLock(layout: layout)
    let registry = StoreRegistry(
        configuration: RegistryConfiguration(layout: layout, appVersion: try AppVersion(arguments[4])),
        migrations: try MigrationSet.load(directory: arguments[2]), lock: lock, observer: LineObserver())
    let user = try UserID(arguments[3])
    _ = try registry.lifecycle.recoverInterruptedOperations()
    // The parent times its SIGKILL from here: the operation begins.
    FileHandle.standardOutput.write(Data("started\n".utf8))
    switch arguments.count > 5 ? arguments[5] : "open" {
    case "delete":
        let report = try await registry.lifecycle.delete(user, keepBackups: false)
        print("done deleted \(report.removedFiles.count)")
    case "import":
        let report = try await registry.lifecycle.importStore(user, from: .path(arguments[6]), schemaVersion: nil, replace: true)
        print("done imported \(report.schemaVersion)")
    case "restore":
        let (restored, _) = try await registry.lifecycle.restore(user, backup: arguments[6])
        print("done restored \(restored.schemaVersion)")
    default:
        let info = try await registry.info(user)
        print("done \(info.schemaVersion)")
    }
    await registry.shutdown()
} catch {
    FileHandle.standardError.write(Data("error: \(error)\n".utf8))
    exit(1)
}
