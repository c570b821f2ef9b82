import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// New stores copied from the template (`migrations.newStoresFromTemplate`) must be
/// indistinguishable from stores migrated step by step, except for the journal entries.
@Suite struct TemplateTests {
    private func templating() -> MigrationPolicy {
        var policy = MigrationPolicy()
        policy.newStoresFromTemplate = true
        return policy
    }

    /// Everything a store holds that does not depend on when it was made.
    private struct Contents: Equatable {
        var bookkeeping: BookkeepingSnapshot
        var checksums: [String]
        var fingerprint: String
        var schema: [String]
        var rows: [String]
        var journalMode: String
        var integrity: String

        static func read(_ db: Database) throws -> Contents {
            Contents(bookkeeping: try BookkeepingSnapshot.read(db),
                     checksums: try String.fetchAll(db, sql: "SELECT checksum FROM schema_migrations ORDER BY version"),
                     fingerprint: try String.fetchOne(db, sql: "SELECT migrations_fingerprint FROM app_version")!,
                     schema: try String.fetchAll(db, sql: "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"),
                     rows: try String.fetchAll(db, sql: "SELECT title FROM notes ORDER BY id"),
                     journalMode: try String.fetchOne(db, sql: "PRAGMA journal_mode")!,
                     integrity: try String.fetchOne(db, sql: "PRAGMA integrity_check")!)
        }
    }

    private func migrations(_ directory: TemporaryDirectory) throws -> MigrationFolder {
        try MigrationFolder(directory)
            .write("0001_notes.sql", "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL);")
            .write("0002_welcome.sql", "INSERT INTO notes (title) VALUES ('welcome');")
            .write("0003_index.sql", "CREATE INDEX notes_title ON notes (title);")
    }

    @Test func aCopiedStoreHoldsExactlyWhatMigratingStepByStepGives() async throws {
        let stepwiseDirectory = try TemporaryDirectory(), templateDirectory = try TemporaryDirectory()
        let stepwise = try Harness(directory: stepwiseDirectory, migrations: try migrations(stepwiseDirectory).load())
        let templated = try Harness(directory: templateDirectory, migrations: try migrations(templateDirectory).load(), policy: templating())
        try await templated.registry.buildTemplate()
        let before = try await templated.registry.withStore(user("probe"), access: .admin) { store in
            try await store.read { try String.fetchOne($0, sql: "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")! }
        }

        let stepwiseReport = try await stepwise.registry.withStore(user("ann"), reporting: { _, report in report })
        let templateReport = try await templated.registry.withStore(user("ann"), reporting: { _, report in report })
        #expect(stepwiseReport?.created == true && templateReport?.created == true)
        #expect(stepwiseReport?.applied == [1, 2, 3] && templateReport?.applied == [1, 2, 3])
        #expect(templateReport?.fromVersion == 0 && templateReport?.toVersion == 3)

        let expected = try await stepwise.registry.withStore(user("ann")) { try await $0.read(Contents.read) }
        let copied = try await templated.registry.withStore(user("ann")) { try await $0.read(Contents.read) }
        #expect(copied == expected)
        #expect(copied.journalMode == "wal" && copied.integrity == "ok")
        // The copy carries its own creation time, not the template's.
        let created = try await templated.registry.withStore(user("ann")) { store in
            try await store.read { try String.fetchOne($0, sql: "SELECT created_at FROM app_version")! }
        }
        #expect(created >= before)

        #expect(templated.recorder.events.contains(.storeCreated(user: user("ann"), path: templated.layout.storePath(for: user("ann")), templateVersion: 3)))
        #expect(templated.recorder.count { if case .migrationStarted(let who, _, _, _, _) = $0 { who == user("ann") } else { false } } == 0)
        #expect(stepwise.recorder.count { if case .migrationStarted(let who, _, _, _, _) = $0 { who == user("ann") } else { false } } == 1)
        // The scratch file the template was built in is gone; no half-written copy is left.
        #expect(try FileManager.default.contentsOfDirectory(atPath: templated.layout.templatesDirectory).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: templated.layout.storePath(for: user("ann")) + ".new"))
    }

    @Test func afterAReloadNewStoresGetTheNewMigrationsAndOldOnesMigrate() async throws {
        let directory = try TemporaryDirectory()
        let folder = try migrations(directory)
        let harness = try Harness(directory: directory, migrations: try folder.load(), policy: templating())
        try await harness.registry.buildTemplate()
        _ = try await harness.registry.withStore(user("ann")) { _ in }
        try folder.write("0004_more.sql", "INSERT INTO notes (title) VALUES ('second');")
        harness.registry.reload(migrations: try folder.load())
        // The template of the old set must not be used any more, built or not.
        for name in ["bob", "cy"] {
            let rows = try await harness.registry.withStore(user(name)) { store in
                try await store.read { try String.fetchAll($0, sql: "SELECT title FROM notes ORDER BY id") }
            }
            #expect(rows == ["welcome", "second"])
        }
        try await harness.registry.buildTemplate()
        let (rows, version) = try await harness.registry.withStore(user("dee")) { store in
            try await store.read { (try String.fetchAll($0, sql: "SELECT title FROM notes ORDER BY id"), try Int64.fetchOne($0, sql: "PRAGMA user_version")!) }
        }
        #expect(rows == ["welcome", "second"] && version == 4)
        #expect(harness.recorder.events.contains(.storeCreated(user: user("dee"), path: harness.layout.storePath(for: user("dee")), templateVersion: 4)))
        let ann = try await harness.registry.withStore(user("ann")) { store in
            try await store.read { try String.fetchAll($0, sql: "SELECT title FROM notes ORDER BY id") }
        }
        #expect(ann == ["welcome", "second"])
    }

    @Test func aMigrationSetThatCannotBuildATemplateFailsNewStoresAsUsual() async throws {
        let directory = try TemporaryDirectory()
        let folder = try migrations(directory).write("0004_broken.sql", "INSERT INTO missing_table VALUES (1);")
        let harness = try Harness(directory: directory, migrations: try folder.load(), policy: templating())
        await #expect(throws: StoreError.self) { try await harness.registry.buildTemplate() }
        await #expect {
            try await harness.registry.withStore(user("ann")) { _ in }
        } throws: { error in
            if case .migrationFailed(_, let version, _, _, _, let schemaVersion) = error as? StoreError { return version == 4 && schemaVersion == 3 }
            return false
        }
    }
}
