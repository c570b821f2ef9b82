import Foundation

/// Decodes a `Decodable` value from a row: each key is a column name. Properties of the types
/// ``SQLValueDecodable`` covers decode exactly (see there); `Date` from a real or integer
/// (seconds since 1970) or ISO 8601 text; a `RawRepresentable` enum or any other single-value
/// `Decodable` through its raw value. Nested keyed or unkeyed containers are refused: a cell is
/// one value.
struct RowDecoder: Decoder {
    let row: Row
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(KeyedRowContainer<Key>(row: row))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: codingPath, debugDescription: "a row decodes into a keyed type (a struct), not an array"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        // A one-column result decodes into a single value (`query(Int64.self, "SELECT count(*) …")`).
        guard row.values.count == 1 else {
            throw DecodingError.typeMismatch(Any.self, .init(codingPath: codingPath, debugDescription: "a single value needs a one-column row; this one has \(row.values.count)"))
        }
        return CellDecoder(cell: row.values[0], codingPath: [ColumnKey(stringValue: row.columnNames.first ?? "0")])
    }
}

private struct KeyedRowContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let row: Row
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { row.columnNames.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { row[key.stringValue] != nil }

    private func cell(_ key: Key) throws -> SQLValue {
        guard let cell = row[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: [], debugDescription: "no column named '\(key.stringValue)' in \(row.columnNames)"))
        }
        return cell
    }

    func decodeNil(forKey key: Key) throws -> Bool { try cell(key) == .null }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try CellDecoder(cell: cell(key), codingPath: [key]).decode(type)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: [key], debugDescription: "a column holds one value, not a keyed container"))
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: [key], debugDescription: "a column holds one value, not an array ([UInt8] and Data decode from a blob)"))
    }

    func superDecoder() throws -> any Decoder { RowDecoder(row: row) }
    func superDecoder(forKey key: Key) throws -> any Decoder { RowDecoder(row: row) }
}

/// Decodes one cell.
private struct CellDecoder: Decoder, SingleValueDecodingContainer {
    let cell: SQLValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: codingPath, debugDescription: "a column holds one value, not a keyed container"))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: codingPath, debugDescription: "a column holds one value, not an array ([UInt8] and Data decode from a blob)"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    func decodeNil() -> Bool { cell == .null }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        if let exact = type as? any SQLValueDecodable.Type {
            guard let value = exact.init(sqlValue: cell) else { throw mismatch(type) }
            return value as! T // swiftlint:disable:this force_cast — `exact` is `T.self`
        }
        if type == Date.self {
            switch cell {
            case .real(let seconds): return Date(timeIntervalSince1970: seconds) as! T
            case .integer(let seconds): return Date(timeIntervalSince1970: Double(seconds)) as! T
            case .text(let text):
                guard let date = try? Date(text, strategy: .iso8601) else { throw mismatch(type) }
                return date as! T
            default: throw mismatch(type)
            }
        }
        // Anything else decodes through its own single-value form (enums with raw values, URL, ...).
        return try T(from: self)
    }

    // The typed requirements all go through the generic path.
    func decode(_ type: Bool.Type) throws -> Bool { try decodeExact(type) }
    func decode(_ type: String.Type) throws -> String { try decodeExact(type) }
    func decode(_ type: Double.Type) throws -> Double { try decodeExact(type) }
    func decode(_ type: Float.Type) throws -> Float {
        guard let value = Double(sqlValue: cell) else { throw mismatch(type) }
        return Float(value)
    }
    func decode(_ type: Int.Type) throws -> Int { try decodeExact(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try decodeInteger(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try decodeInteger(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try decodeExact(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try decodeExact(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try decodeInteger(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try decodeInteger(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try decodeInteger(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try decodeInteger(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeInteger(type) }

    private func decodeExact<T: SQLValueDecodable>(_ type: T.Type) throws -> T {
        guard let value = T(sqlValue: cell) else { throw mismatch(type) }
        return value
    }

    private func decodeInteger<T: FixedWidthInteger>(_ type: T.Type) throws -> T {
        guard case .integer(let value) = cell, let exact = T(exactly: value) else { throw mismatch(type) }
        return exact
    }

    private func mismatch(_ type: Any.Type) -> DecodingError {
        let name = codingPath.last?.stringValue ?? "?"
        return .typeMismatch(type, .init(codingPath: codingPath, debugDescription: "column '\(name)' holds \(cell), not a \(type)"))
    }
}
