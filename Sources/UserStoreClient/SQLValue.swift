import Foundation
import Varlink

/// One SQLite value, exactly as the daemon stores it: a parameter to bind or a result cell.
///
/// Integers stay 64-bit integers and reals stay doubles on the wire (the daemon's JSON keeps
/// the difference: `2` is an integer, `2.0` a real), so nothing goes through a double by accident.
public enum SQLValue: Sendable, Hashable {
    /// SQL NULL.
    case null
    /// A 64-bit integer.
    case integer(Int64)
    /// A double (SQLite's REAL).
    case real(Double)
    /// UTF-8 text (any Unicode scalar, NUL included).
    case text(String)
    /// Bytes.
    case blob(Data)

    /// The cell at `index` of a reply, read in place; nil for JSON that is no SQLite value.
    init?(_ view: JSONView, _ index: Int) {
        switch view.kind(index) {
        case .null: self = .null
        case .true: self = .integer(1)
        case .false: self = .integer(0)
        case .string: self = .text(view.string(index))
        case .number:
            if let integer = view.integer(index) {
                self = .integer(integer)
            } else if let real = view.double(index) {
                self = .real(real)
            } else {
                return nil
            }
        case .object:
            guard view.count(index) == 1, let encoded = view.member("blob", of: index), view.kind(encoded) == .string,
                  let data = Data(base64Encoded: view.string(encoded)) else { return nil }
            self = .blob(data)
        case .array:
            return nil
        }
    }

    /// Whether this is SQL NULL.
    public var isNull: Bool { self == .null }
}

extension SQLValue: CustomStringConvertible {
    /// The value as SQL would show it (`NULL`, `42`, `2.5`, `"text"`, `blob(3 bytes)`).
    public var description: String {
        switch self {
        case .null: return "NULL"
        case .integer(let value): return String(value)
        case .real(let value): return String(value)
        case .text(let value): return String(reflecting: value)
        case .blob(let data): return "blob(\(data.count) bytes)"
        }
    }
}

/// A Swift value that binds as a statement parameter: Int, Int64, Int32, Double, String, Bool,
/// Data, [UInt8], ``SQLValue``, and Optionals of these (nil binds NULL).
public protocol SQLValueConvertible: Sendable {
    /// The value to bind.
    var sqlValue: SQLValue { get }
}

/// A Swift value that a result cell decodes into (the same types as ``SQLValueConvertible``).
/// Conversions are exact or refused: a real never becomes an integer, text never becomes a number.
public protocol SQLValueDecodable {
    /// The value of `cell`, or nil when `cell` cannot be this type without loss.
    init?(sqlValue cell: SQLValue)
}

extension SQLValue: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { self }
    public init?(sqlValue cell: SQLValue) { self = cell }
}

extension Int64: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .integer(self) }
    public init?(sqlValue cell: SQLValue) {
        guard case .integer(let value) = cell else { return nil }
        self = value
    }
}

extension Int: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .integer(Int64(self)) }
    public init?(sqlValue cell: SQLValue) {
        guard case .integer(let value) = cell, let exact = Int(exactly: value) else { return nil }
        self = exact
    }
}

extension Int32: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .integer(Int64(self)) }
    public init?(sqlValue cell: SQLValue) {
        guard case .integer(let value) = cell, let exact = Int32(exactly: value) else { return nil }
        self = exact
    }
}

extension Double: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .real(self) }
    /// A real, or an integer that a double holds exactly (SQLite stores 2.0 in a REAL column
    /// of a table as the integer 2 when it saves space, and reads it back as 2.0).
    public init?(sqlValue cell: SQLValue) {
        switch cell {
        case .real(let value): self = value
        case .integer(let value):
            guard let exact = Double(exactly: value) else { return nil }
            self = exact
        default: return nil
        }
    }
}

extension String: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .text(self) }
    public init?(sqlValue cell: SQLValue) {
        guard case .text(let value) = cell else { return nil }
        self = value
    }
}

extension Bool: SQLValueConvertible, SQLValueDecodable {
    /// SQLite has no boolean: true binds 1, false 0.
    public var sqlValue: SQLValue { .integer(self ? 1 : 0) }
    /// 0 is false, 1 is true; any other value is refused.
    public init?(sqlValue cell: SQLValue) {
        guard case .integer(let value) = cell, value == 0 || value == 1 else { return nil }
        self = value == 1
    }
}

extension Data: SQLValueConvertible, SQLValueDecodable {
    public var sqlValue: SQLValue { .blob(self) }
    public init?(sqlValue cell: SQLValue) {
        guard case .blob(let data) = cell else { return nil }
        self = data
    }
}

extension Array: SQLValueConvertible where Element == UInt8 {
    public var sqlValue: SQLValue { .blob(Data(self)) }
}

extension Array: SQLValueDecodable where Element == UInt8 {
    public init?(sqlValue cell: SQLValue) {
        guard case .blob(let data) = cell else { return nil }
        self = Array(data)
    }
}

extension Optional: SQLValueConvertible where Wrapped: SQLValueConvertible {
    /// nil binds NULL.
    public var sqlValue: SQLValue { self?.sqlValue ?? .null }
}

extension Optional: SQLValueDecodable where Wrapped: SQLValueDecodable {
    /// NULL is nil; any other value must decode as `Wrapped`.
    public init?(sqlValue cell: SQLValue) {
        if cell == .null {
            self = .none
        } else if let value = Wrapped(sqlValue: cell) {
            self = .some(value)
        } else {
            return nil
        }
    }
}
