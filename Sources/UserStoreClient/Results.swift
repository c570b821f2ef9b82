import Varlink

/// What an `execute` did.
public struct ExecuteResult: Sendable, Equatable {
    /// Rows the statement inserted, updated or deleted (`sqlite3_changes64`); 0 for a read.
    public let changes: Int64
    /// The rowid of the connection's last successful INSERT (`sqlite3_last_insert_rowid`).
    public let lastInsertRowID: Int64

    init(_ reply: [String: JSONValue]) throws {
        guard let changes = reply["changes"]?.integerValue, let rowID = reply["lastInsertRowId"]?.integerValue else {
            throw UserStoreError.protocolViolation("an Execute reply without changes and lastInsertRowId")
        }
        self.changes = changes
        lastInsertRowID = rowID
    }
}

/// One statement of a ``UserStore/batch(_:transaction:)``.
public struct Statement: Sendable {
    /// The SQL (one statement).
    public var sql: String
    var parameters: Parameters

    /// `sql` with positional parameters (bound to `?`, `?1`, ...).
    public init(_ sql: String, _ parameters: (any SQLValueConvertible)?...) {
        self.init(sql, .positional(parameters))
    }

    /// `sql` with named parameters: `"name"` binds `:name`, `@name` and `$name`.
    public init(_ sql: String, named parameters: [String: (any SQLValueConvertible)?]) {
        self.init(sql, .named(parameters))
    }

    init(_ sql: String, _ parameters: Parameters) {
        self.sql = sql
        self.parameters = parameters
    }

    /// `sql` and `parameters`, as a Query, Execute or Batch statement carries them.
    var fields: [String: JSONValue] {
        var fields: [String: JSONValue] = ["sql": .string(sql)]
        if let parameters = parameters.json { fields["parameters"] = parameters }
        return fields
    }
}

/// A statement's parameters as they go on the wire.
enum Parameters: Sendable {
    case positional([SQLValue])
    case named([String: SQLValue])

    /// The values of a variadic parameter list (nil binds NULL).
    static func positional(_ values: [(any SQLValueConvertible)?]) -> Parameters {
        .positional(values.map { $0?.sqlValue ?? .null })
    }

    /// Named values (nil binds NULL).
    static func named(_ values: [String: (any SQLValueConvertible)?]) -> Parameters {
        .named(values.mapValues { $0?.sqlValue ?? .null })
    }

    var json: JSONValue? {
        switch self {
        case .positional(let values): return values.isEmpty ? nil : .array(values.map(\.json))
        case .named(let values): return .object(values.mapValues(\.json))
        }
    }
}

/// What one statement of a Batch produced: rows for a statement that returns them, and
/// changes and the last rowid for each.
public struct StatementResult: Sendable {
    /// The rows (empty for a statement that returns none).
    public let rows: [Row]
    /// The column names (empty for a statement that returns no rows).
    public let columns: [String]
    /// Rows the statement changed (0 for a read).
    public let changes: Int64
    /// The store's last inserted rowid after the statement.
    public let lastInsertRowID: Int64
}

/// What `Open` reported about a store.
public struct StoreInfo: Sendable, Equatable {
    /// The user ID.
    public let user: String
    /// The schema version the store is at (its latest applied migration).
    public let schemaVersion: Int64
    /// The application version stamped in the store's app_version table.
    public let appVersion: String
    /// The application version that created the store.
    public let createdByAppVersion: String
    /// Whether this call created the store.
    public let created: Bool
    /// Whether migrations ran for this call (or for a concurrent one it waited for).
    public let migrated: Bool
    /// The versions that ran.
    public let appliedVersions: [Int64]
}

/// The decoding of replies into rows.
enum Replies {
    /// A reply's `columns` (empty when it has none).
    static func columns(_ reply: [String: JSONValue]) -> Columns {
        Columns(reply["columns"]?.arrayValue?.compactMap(\.stringValue) ?? [])
    }

    /// A reply's `rows` (each an array of values, one per column of `columns`).
    static func rows(_ reply: [String: JSONValue], columns: Columns) throws -> [Row] {
        guard let list = reply["rows"]?.arrayValue else { return [] }
        var rows: [Row] = []
        rows.reserveCapacity(list.count)
        for element in list {
            guard let cells = element.arrayValue, cells.count == columns.names.count else {
                throw UserStoreError.protocolViolation("a row that does not match its \(columns.names.count) columns")
            }
            var values: [SQLValue] = []
            values.reserveCapacity(cells.count)
            for cell in cells {
                guard let value = SQLValue(json: cell) else { throw UserStoreError.protocolViolation("a cell that is no SQLite value: \(cell.serialized)") }
                values.append(value)
            }
            rows.append(Row(columns: columns, values: values))
        }
        return rows
    }

    /// A Query reply's rows.
    static func rows(_ reply: [String: JSONValue]) throws -> [Row] {
        try rows(reply, columns: columns(reply))
    }

    static func batch(_ reply: [String: JSONValue]) throws -> [StatementResult] {
        guard let results = reply["results"]?.arrayValue else { throw UserStoreError.protocolViolation("a Batch reply without results") }
        return try results.map { result in
            guard let fields = result.objectValue else { throw UserStoreError.protocolViolation("a Batch result that is not an object") }
            let columns = columns(fields)
            let counts = try ExecuteResult(fields)
            return StatementResult(rows: try rows(fields, columns: columns), columns: columns.names, changes: counts.changes,
                                   lastInsertRowID: counts.lastInsertRowID)
        }
    }

    static func info(_ reply: [String: JSONValue]) throws -> StoreInfo {
        guard let user = reply["user"]?.stringValue, let version = reply["schemaVersion"]?.integerValue else {
            throw UserStoreError.protocolViolation("an Open reply without user and schemaVersion")
        }
        return StoreInfo(user: user, schemaVersion: version, appVersion: reply["appVersion"]?.stringValue ?? "",
                         createdByAppVersion: reply["createdByAppVersion"]?.stringValue ?? "",
                         created: reply["created"]?.boolValue ?? false, migrated: reply["migrated"]?.boolValue ?? false,
                         appliedVersions: reply["appliedVersions"]?.arrayValue?.compactMap(\.integerValue) ?? [])
    }
}
