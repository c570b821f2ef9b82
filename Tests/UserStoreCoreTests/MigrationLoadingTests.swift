import Foundation
import Testing
@testable import UserStoreCore

@Suite struct MigrationLoadingTests {
    @Test func loadsFilesInVersionOrderWithSectionsAndGaps() throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0010-later.sql", "CREATE TABLE later (id INTEGER);")
            .write("0001_initial.sql", "-- Up\nCREATE TABLE a (id INTEGER);\nCREATE TABLE b (id INTEGER);\n-- Down\nDROP TABLE b;\nDROP TABLE a;\n")
            .write("README.md", "not a migration")
        let set = try folder.load()
        #expect(set.migrations.map(\.version) == [1, 10])
        #expect(set.migrations.map(\.name) == ["initial", "later"])
        #expect(set.migrations[0].up.count == 2)
        #expect(set.migrations[0].down == ["DROP TABLE b;", "DROP TABLE a;"])
        #expect(set.migrations[1].down == nil)
        #expect(set.latestVersion == 10)
    }

    @Test func duplicateAndMalformedVersionsNameTheFiles() throws {
        let directory = try TemporaryDirectory()
        let folder = try MigrationFolder(directory)
            .write("0001_a.sql", "SELECT 1;")
            .write("1-b.sql", "SELECT 1;")
            .write("abc.sql", "SELECT 1;")
            .write("0000_zero.sql", "SELECT 1;")
            .write("12x.sql", "SELECT 1;")
        let error = try #require(throws: MigrationSetError.self) { try folder.load() }
        #expect(error.problems.contains(.duplicateVersion(version: 1, files: ["0001_a.sql", "1-b.sql"])))
        #expect(error.problems.contains(.malformedFileName(file: "abc.sql")))
        #expect(error.problems.contains(.malformedFileName(file: "12x.sql")))
        #expect(error.problems.contains(.versionOutOfRange(file: "0000_zero.sql")))
        #expect(error.description.contains("0001_a.sql, 1-b.sql"))
    }

    @Test func splitsStatementsLikeTheSqliteShell() {
        let script = SQLScript("""
            -- a comment; with a semicolon
            CREATE TABLE t (x TEXT DEFAULT 'a;b');
            CREATE TRIGGER tr AFTER INSERT ON t BEGIN
                UPDATE t SET x = 'c;d';
                DELETE FROM t WHERE x = ';';
            END;
            /* block; comment */ INSERT INTO t VALUES ('e');
            """)
        #expect(script.statements.count == 3)
        #expect(script.statements[1].contains("END;"))
        #expect(script.incompleteTail == nil)
        #expect(SQLScript("SELECT 1; SELECT 'unterminated").incompleteTail != nil)
    }

    @Test func acceptsOtherToolsMarkersAndDropsTransactionControl() throws {
        let text = """
            -- +goose Up
            BEGIN TRANSACTION;
            PRAGMA foreign_keys = OFF;
            CREATE TABLE t (id INTEGER);
            COMMIT;
            -- +goose Down
            DROP TABLE t;
            """
        let migration = try MigrationFileParser.parse(version: 1, name: "t", fileName: "0001_t.sql", contents: text)
        #expect(migration.up == ["CREATE TABLE t (id INTEGER);"])
        #expect(migration.down == ["DROP TABLE t;"])
        #expect(migration.ignoredStatements.count == 3)
        let dbmate = try MigrationFileParser.parse(version: 2, name: "x", fileName: "2_x.sql", contents: "-- migrate:up\nSELECT 1;\n-- migrate:down\nSELECT 2;\n")
        #expect(dbmate.up == ["SELECT 1;"] && dbmate.down == ["SELECT 2;"])
    }

    @Test(arguments: [
        ("VACUUM;", "VACUUM"),
        ("ATTACH 'x.db' AS x;", "ATTACH"),
        ("PRAGMA journal_mode = DELETE;", "PRAGMA"),
        ("PRAGMA user_version = 7;", "PRAGMA"),
        ("ROLLBACK;", "ROLLBACK"),
    ])
    func refusesStatementsThatCannotRunInAMigration(_ sql: String, _ keyword: String) {
        #expect {
            try MigrationFileParser.parse(version: 1, name: "x", fileName: "0001_x.sql", contents: "CREATE TABLE ok (id INTEGER);\n" + sql)
        } throws: { error in
            guard case .forbiddenStatement(let file, let statement, _) = error as? MigrationProblem else { return false }
            return file == "0001_x.sql" && statement.hasPrefix(keyword)
        }
    }

    @Test func refusesMissingUpTextBeforeMarkersAndUnterminatedStatements() {
        #expect(throws: MigrationProblem.missingUp(file: "1_a.sql")) {
            try MigrationFileParser.parse(version: 1, name: "a", fileName: "1_a.sql", contents: "-- Up\n-- nothing here\n-- Down\nDROP TABLE a;")
        }
        #expect(throws: MigrationProblem.textBeforeFirstSection(file: "1_a.sql")) {
            try MigrationFileParser.parse(version: 1, name: "a", fileName: "1_a.sql", contents: "SELECT 1;\n-- Up\nSELECT 2;")
        }
        #expect(throws: MigrationProblem.self) {
            try MigrationFileParser.parse(version: 1, name: "a", fileName: "1_a.sql", contents: "CREATE TABLE a (id INTEGER)")
        }
    }

    @Test func checksumsIgnoreLineEndingsAndTheDownSectionButNotTheSQL() throws {
        func checksum(_ text: String) throws -> String {
            try MigrationFileParser.parse(version: 1, name: "a", fileName: "1_a.sql", contents: text).checksum
        }
        let unix = try checksum("-- Up\nCREATE TABLE a (id INTEGER);\nINSERT INTO a VALUES (1);\n-- Down\nDROP TABLE a;\n")
        let windows = try checksum("\u{FEFF}-- Up\r\nCREATE TABLE a (id INTEGER);  \r\nINSERT INTO a VALUES (1);\r\n\r\n-- Down\r\nDROP TABLE a;\r\n")
        let newDown = try checksum("-- Up\nCREATE TABLE a (id INTEGER);\nINSERT INTO a VALUES (1);\n-- Down\nDROP TABLE IF EXISTS a;\n")
        let changed = try checksum("-- Up\nCREATE TABLE a (id INTEGER);\nINSERT INTO a VALUES (2);\n-- Down\nDROP TABLE a;\n")
        #expect(unix == windows)
        #expect(unix == newDown)
        #expect(unix != changed)
        #expect(unix.count == 64)
    }

    @Test func parsesTheAppVersionDirective() throws {
        let migration = try MigrationFileParser.parse(version: 4, name: "fix", fileName: "0004_fix.sql",
                                                      contents: "-- userstore:app-version-below 1.10\nUPDATE notes SET title = trim(title);\n")
        #expect(migration.appVersionBelow == (try AppVersion("1.10")))
        #expect(throws: MigrationProblem.self) {
            try MigrationFileParser.parse(version: 4, name: "fix", fileName: "0004_fix.sql", contents: "-- userstore:app-version-blow 1.10\nSELECT 1;\n")
        }
    }

    @Test func theRepositoryExampleLoads() throws {
        let set = try MigrationSet.load(directory: exampleMigrationsDirectory)
        #expect(set.migrations.count >= 5)
        #expect(set.migrations.allSatisfy { $0.down != nil })
    }
}
