import Foundation
import GRDB
import Testing
@testable import UserStoreCore

/// `-- Compatible`: a store migrated past the loaded migrations (a rolling deploy's newer host)
/// is served by an older daemon only when every migration it is ahead by was marked so.
@Suite struct CompatibleMigrationTests {
    @Test func theMarkerIsParsedAndCountsInTheChecksum() throws {
        let marked = try MigrationFileParser.parse(version: 3, name: "c", fileName: "0003_c.sql",
                                                   contents: "-- Compatible\nALTER TABLE a ADD COLUMN note TEXT;\nCREATE INDEX a_note ON a (note);")
        let plain = try MigrationFileParser.parse(version: 3, name: "c", fileName: "0003_c.sql",
                                                  contents: "ALTER TABLE a ADD COLUMN note TEXT;\nCREATE INDEX a_note ON a (note);")
        #expect(marked.compatible && !plain.compatible && marked.checksum != plain.checksum)
        #expect(marked.up == plain.up)
        #expect(try MigrationFileParser.parse(version: 4, name: "d", fileName: "0004_d.sql",
                                              contents: "-- userstore:compatible\n-- Up\nCREATE TABLE \"d\" (x);\nCREATE UNIQUE INDEX d_x ON d (x);").compatible)
    }

    @Test(arguments: ["DROP TABLE a;", "ALTER TABLE a RENAME TO b;", "ALTER TABLE a DROP COLUMN x;", "UPDATE a SET x = 1;",
                      "CREATE TRIGGER t AFTER INSERT ON a BEGIN SELECT 1; END;", "CREATE VIEW v AS SELECT 1;"])
    func theMarkerIsRefusedOnAnythingButAdditions(statement: String) {
        #expect(throws: MigrationProblem.self) {
            try MigrationFileParser.parse(version: 3, name: "c", fileName: "0003_c.sql", contents: "-- Compatible\nCREATE TABLE ok (x);\n\(statement)")
        }
    }

    /// Migrates `erin` with 0001-0003 (0003 written by `third`), then opens her store with 0001-0002 only.
    private func olderDaemonOpens(third: String) async throws -> (Result<StoreVersionInfo, StoreError>, Data, Data) {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_a.sql", "CREATE TABLE a (x);")
            .write("0002_b.sql", "CREATE TABLE b (x);")
            .write("0003_c.sql", third)
        do {
            let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "2.0")
            _ = try await harness.registry.withStore(user("erin")) { store in
                try await store.write { try $0.execute(sql: "INSERT INTO a (x) VALUES (1)") }
            }
            await harness.registry.shutdown()
        }
        let path = StoreLayout(dataDirectory: directory.path + "/data").storePath(for: user("erin"))
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        try folder.remove("0003_c.sql")
        let harness = try Harness(directory: directory, migrations: try folder.load(), appVersion: "1.9")
        let outcome: Result<StoreVersionInfo, StoreError>
        do {
            let info = try await harness.registry.info(user("erin"))
            let rows = try await harness.registry.withStore(user("erin")) { store in
                try await store.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM a") }
            }
            #expect(rows == 1)
            outcome = .success(info)
        } catch let error as StoreError {
            outcome = .failure(error)
        }
        await harness.registry.shutdown()
        return (outcome, before, try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    @Test func anOlderDaemonServesAStoreAheadByCompatibleMigrationsAsItIs() async throws {
        let (outcome, before, after) = try await olderDaemonOpens(third: "-- Compatible\nALTER TABLE a ADD COLUMN note TEXT DEFAULT '';")
        let info = try outcome.get()
        #expect(info.schemaVersion == 3 && info.appVersion == "2.0") // the newer app version stays recorded
        #expect(after == before)                                      // nothing written to it
    }

    @Test func withoutTheMarkerItIsStillTooNew() async throws {
        let (outcome, _, _) = try await olderDaemonOpens(third: "ALTER TABLE a ADD COLUMN note TEXT DEFAULT '';")
        #expect(throws: StoreError.storeTooNew(user: user("erin"), storeVersion: 3, knownVersion: 2)) { try outcome.get() }
    }
}
