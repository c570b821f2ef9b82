import Varlink

/// What an `execute` did.
public struct ExecuteResult: Sendable, Equatable {
    /// Rows the statement inserted, updated or deleted (`sqlite3_changes64`); 0 for a read.
    public let changes: Int64
    /// The rowid of the connection's last successful INSERT (`sqlite3_last_insert_rowid`).
    public let lastInsertRowID: Int64

    /// From the `changes` and `lastInsertRowId` of the object at `object`.
    init(_ view: JSONView, _ object: Int?) throws {
        guard let object, let changes = view.member("changes", of: object).flatMap(view.integer),
              let rowID = view.member("lastInsertRowId", of: object).flatMap(view.integer) else {
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

/// The decoding of replies, read in place from their bytes (``JSONView``) on the caller's thread.
enum Replies {
    /// Parses a reply and calls `body` with its view and the index of its `parameters` object
    /// (nil when it has none).
    ///
    /// - Throws: the daemon's error as a ``UserStoreError``; a reply that is not valid varlink,
    ///   or that says more follow (`continues`), as ``UserStoreError/Kind/protocolViolation``.
    static func read<T>(_ bytes: [UInt8], _ body: (JSONView, Int?) throws -> T) throws -> T {
        try readStreamed(bytes) { view, parameters, continues in
            if continues { throw UserStoreError.protocolViolation("a reply with continues to a call without more") }
            return try body(view, parameters)
        }
    }

    /// ``read(_:_:)`` for a reply to a call with `more`: `body` also learns whether more follow.
    static func readStreamed<T>(_ bytes: [UInt8], _ body: (JSONView, Int?, _ continues: Bool) throws -> T) throws -> T {
        var tape = JSONTape(maxDepth: 512, reservingTokens: 64)
        return try bytes.withUnsafeBufferPointer { buffer in
            do {
                try tape.parse(buffer)
            } catch {
                throw UserStoreError.protocolViolation("an unreadable reply: \(error)")
            }
            return try tape.withView(buffer) { view in
                guard view.kind(0) == .object else { throw UserStoreError.protocolViolation("a reply that is not a JSON object") }
                let parameters = view.member("parameters", of: 0).flatMap { view.kind($0) == .object ? $0 : nil }
                if let error = view.member("error", of: 0), view.kind(error) == .string {
                    throw UserStoreError(daemonError: view.string(error), view, parameters: parameters)
                }
                let continues = view.member("continues", of: 0).flatMap(view.bool) ?? false
                return try body(view, parameters, continues)
            }
        }
    }

    /// A reply's parameters as values (for the replies read rarely: Open, Begin).
    static func parameters(_ bytes: [UInt8]) throws -> [String: JSONValue] {
        try read(bytes) { view, parameters in parameters.map { view.value($0).objectValue ?? [:] } ?? [:] }
    }

    /// The `columns` of the object at `object` (empty when it has none).
    static func columns(_ view: JSONView, _ object: Int?) -> Columns {
        guard let object, let list = view.member("columns", of: object), view.kind(list) == .array else { return Columns([]) }
        var names: [String] = []
        names.reserveCapacity(view.count(list))
        view.forEachElement(of: list) { _, element in
            if view.kind(element) == .string { names.append(view.string(element)) }
        }
        return Columns(names)
    }

    /// The `rows` of the object at `object` (each an array of values, one per column of `columns`).
    static func rows(_ view: JSONView, _ object: Int?, columns: Columns) throws -> [Row] {
        guard let object, let list = view.member("rows", of: object), view.kind(list) == .array else { return [] }
        var rows: [Row] = []
        rows.reserveCapacity(view.count(list))
        try view.forEachElement(of: list) { _, element in
            guard view.kind(element) == .array, view.count(element) == columns.names.count else {
                throw UserStoreError.protocolViolation("a row that does not match its \(columns.names.count) columns")
            }
            var values: [SQLValue] = []
            values.reserveCapacity(columns.names.count)
            try view.forEachElement(of: element) { _, cell in
                guard let value = SQLValue(view, cell) else {
                    throw UserStoreError.protocolViolation("a cell that is no SQLite value: \(view.value(cell).serialized)")
                }
                values.append(value)
            }
            rows.append(Row(columns: columns, values: values))
        }
        return rows
    }

    /// A Query reply's rows.
    static func rows(_ bytes: [UInt8]) throws -> [Row] {
        try read(bytes) { view, parameters in try rows(view, parameters, columns: columns(view, parameters)) }
    }

    static func execute(_ bytes: [UInt8]) throws -> ExecuteResult {
        try read(bytes) { view, parameters in try ExecuteResult(view, parameters) }
    }

    static func batch(_ bytes: [UInt8]) throws -> [StatementResult] {
        try read(bytes) { view, parameters in
            guard let parameters, let results = view.member("results", of: parameters), view.kind(results) == .array else {
                throw UserStoreError.protocolViolation("a Batch reply without results")
            }
            var list: [StatementResult] = []
            list.reserveCapacity(view.count(results))
            try view.forEachElement(of: results) { _, result in
                guard view.kind(result) == .object else { throw UserStoreError.protocolViolation("a Batch result that is not an object") }
                let columns = columns(view, result)
                let counts = try ExecuteResult(view, result)
                list.append(StatementResult(rows: try rows(view, result, columns: columns), columns: columns.names,
                                            changes: counts.changes, lastInsertRowID: counts.lastInsertRowID))
            }
            return list
        }
    }

    static func info(_ bytes: [UInt8]) throws -> StoreInfo {
        let reply = try parameters(bytes)
        guard let user = reply["user"]?.stringValue, let version = reply["schemaVersion"]?.integerValue else {
            throw UserStoreError.protocolViolation("an Open reply without user and schemaVersion")
        }
        return StoreInfo(user: user, schemaVersion: version, appVersion: reply["appVersion"]?.stringValue ?? "",
                         createdByAppVersion: reply["createdByAppVersion"]?.stringValue ?? "",
                         created: reply["created"]?.boolValue ?? false, migrated: reply["migrated"]?.boolValue ?? false,
                         appliedVersions: reply["appliedVersions"]?.arrayValue?.compactMap(\.integerValue) ?? [])
    }
}
