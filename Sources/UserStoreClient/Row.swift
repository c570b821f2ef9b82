import Foundation

/// The column names of a result, shared by its rows.
final class Columns: Sendable {
    let names: [String]
    /// Offsets by name, for results wide enough that a search would cost more than hashing.
    private let index: [String: Int]?

    init(_ names: [String]) {
        self.names = names
        guard names.count > 16 else {
            index = nil
            return
        }
        // The first column of a name wins, as in SQLite's own lookups.
        var index: [String: Int] = [:]
        for (offset, name) in names.enumerated() where index[name] == nil { index[name] = offset }
        self.index = index
    }

    func offset(of name: String) -> Int? {
        if let index { return index[name] }
        return names.firstIndex(of: name)
    }
}

/// One result row: its values, by column name or position.
///
/// ```swift
/// let rows = try await alice.query("SELECT id, body FROM notes")
/// let id = try rows[0].decode(Int64.self, column: "id")
/// let body = try rows[0].decode(String.self, column: 1)
/// ```
public struct Row: Sendable {
    let columns: Columns
    /// The row's values, in column order.
    public let values: [SQLValue]

    init(columns: Columns, values: [SQLValue]) {
        self.columns = columns
        self.values = values
    }

    /// The column names, in order.
    public var columnNames: [String] { columns.names }

    /// The value of column `name`, or nil when the row has no such column.
    public subscript(name: String) -> SQLValue? {
        columns.offset(of: name).map { values[$0] }
    }

    /// The value at `position`.
    public subscript(position: Int) -> SQLValue { values[position] }

    /// The value of column `name` as `type`.
    ///
    /// - Throws: `DecodingError.keyNotFound` when the row has no such column,
    ///   `DecodingError.typeMismatch` when its value is not a `type` (a NULL into a non-Optional,
    ///   a real into an integer, text into a number, an integer too large for `Int32`, ...).
    public func decode<T: SQLValueDecodable>(_ type: T.Type, column name: String) throws -> T {
        guard let offset = columns.offset(of: name) else {
            throw DecodingError.keyNotFound(ColumnKey(stringValue: name),
                                            .init(codingPath: [], debugDescription: "no column named '\(name)' in \(columns.names)"))
        }
        return try decode(type, column: offset)
    }

    /// The value at column `position` (from 0) as `type`; throws as ``decode(_:column:)-(_,String)``.
    public func decode<T: SQLValueDecodable>(_ type: T.Type, column position: Int) throws -> T {
        guard values.indices.contains(position) else {
            throw DecodingError.keyNotFound(ColumnKey(intValue: position),
                                            .init(codingPath: [], debugDescription: "no column \(position): the row has \(values.count)"))
        }
        let cell = values[position]
        guard let value = T(sqlValue: cell) else {
            let name = columns.names.indices.contains(position) ? columns.names[position] : String(position)
            throw DecodingError.typeMismatch(T.self, .init(codingPath: [ColumnKey(stringValue: name)],
                                                          debugDescription: "column '\(name)' holds \(cell), not a \(T.self)"))
        }
        return value
    }

    /// The row as a `Decodable` type: each stored property from the column of its coding key.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try T(from: RowDecoder(row: self))
    }
}

/// A coding key naming a column.
struct ColumnKey: CodingKey {
    var stringValue: String
    var intValue: Int?

    init(stringValue: String) {
        self.stringValue = stringValue
    }

    init(intValue: Int) {
        self.stringValue = String(intValue)
        self.intValue = intValue
    }
}
