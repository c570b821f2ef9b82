import Crypto
import Foundation
import GRDB

/// A desired-schema file (`schemaFile`): CREATE TABLE / INDEX / VIEW / TRIGGER statements that
/// say what a store should look like. Applied after the numbered migrations; recorded by hash in
/// `app_version.schema_hash`, so a store already reconciled with this file costs nothing on open.
public struct DesiredSchema: Sendable, Equatable {
    /// The file's name (as it appears in events and errors).
    public let fileName: String
    /// The schema text.
    public let sql: String
    /// Hex SHA-256 of the text with normalised line endings.
    public let hash: String
    /// The schema as built once in a pristine in-memory database; every plan compares with it.
    let desired: SchemaSnapshot

    /// Why a schema file cannot be used.
    public struct LoadError: Error, Equatable, Sendable, CustomStringConvertible {
        public let file: String
        public let message: String
        public var description: String { "\(file): \(message)" }
    }

    public init(fileName: String, sql: String) throws(LoadError) {
        self.fileName = fileName
        self.sql = sql
        self.hash = MigrationChecksum.of(upSection: sql, directives: [])
        for statement in SQLScript(sql).statements {
            let keyword = SQLScript.keywords(of: statement, count: 3)
            guard keyword.first == "CREATE" else {
                throw LoadError(file: fileName, message: "only CREATE TABLE / INDEX / VIEW / TRIGGER statements belong in a schema file, not '\(StatementPolicy.summary(of: statement))'")
            }
        }
        do {
            desired = try SchemaSnapshot.desired(sql)
        } catch let error as DatabaseError {
            throw LoadError(file: fileName, message: error.message ?? "\(error.resultCode)")
        } catch {
            throw LoadError(file: fileName, message: "\(error)")
        }
    }

    /// Loads and checks the file at `path` (it must build in an empty database).
    public static func load(path: String) throws(LoadError) -> DesiredSchema {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
            throw LoadError(file: path, message: "cannot read the schema file (missing, unreadable or not UTF-8)")
        }
        return try DesiredSchema(fileName: URL(fileURLWithPath: path).lastPathComponent, sql: text)
    }

    /// What reconciling the store open on `db` with this schema would run.
    public func plan(_ db: Database) throws -> ReconcilePlan {
        try SchemaReconciler(desired: desired).plan(db)
    }
}
