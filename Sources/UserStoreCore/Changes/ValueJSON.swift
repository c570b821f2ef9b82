import Foundation
import GRDBSQLite
import VarlinkJSON

/// SQLite values as JSON, the value table of `io.userstore.Store`: integers and reals as
/// numbers, text as strings, blobs as `{"blob": base64}`, NULL as null. One encoding for query
/// results (a statement's columns) and for recorded changes (the pre-update hook's values).
public enum ValueJSON {
    /// Column `column` of `statement`'s current row.
    @inline(__always)
    public static func write(column: Int32, of statement: OpaquePointer, into writer: inout JSONWriter) {
        write(ColumnCell(statement: statement, column: column), into: &writer)
    }

    /// A protected or unprotected `sqlite3_value`.
    public static func write(value: OpaquePointer, into writer: inout JSONWriter) {
        write(ValueCell(value: value), into: &writer)
    }

    @inline(__always)
    private static func write<Cell: SQLiteCell>(_ cell: Cell, into writer: inout JSONWriter) {
        switch cell.type {
        case SQLITE_INTEGER:
            writer.write(cell.integer)
        case SQLITE_FLOAT:
            writer.write(cell.real)
        case SQLITE_TEXT:
            let count = cell.byteCount
            guard let text = cell.text else { writer.write(""); return }
            let bytes = UnsafeBufferPointer(start: text, count: count)
            if bytes.allSatisfy({ $0 < 0x80 }) || String(validating: bytes, as: UTF8.self) != nil {
                writer.writeString(utf8: bytes)
            } else {
                // Text that is not UTF-8 (made by CAST of a blob) cannot be JSON text as is.
                writer.write(String(decoding: bytes, as: UTF8.self))
            }
        case SQLITE_BLOB:
            let count = cell.byteCount
            let data = count == 0 ? Data() : Data(bytes: cell.blob!, count: count)
            writer.raw("{\"blob\":")
            writer.write(data.base64EncodedString())
            writer.raw(byte: UInt8(ascii: "}"))
        default:
            writer.raw("null")
        }
    }
}

/// One value, wherever SQLite holds it.
private protocol SQLiteCell {
    var type: Int32 { get }
    var integer: Int64 { get }
    var real: Double { get }
    var text: UnsafePointer<UInt8>? { get }
    var blob: UnsafeRawPointer? { get }
    var byteCount: Int { get }
}

private struct ColumnCell: SQLiteCell {
    let statement: OpaquePointer
    let column: Int32
    var type: Int32 { sqlite3_column_type(statement, column) }
    var integer: Int64 { sqlite3_column_int64(statement, column) }
    var real: Double { sqlite3_column_double(statement, column) }
    var text: UnsafePointer<UInt8>? { sqlite3_column_text(statement, column) }
    var blob: UnsafeRawPointer? { sqlite3_column_blob(statement, column) }
    var byteCount: Int { Int(sqlite3_column_bytes(statement, column)) }
}

private struct ValueCell: SQLiteCell {
    let value: OpaquePointer
    var type: Int32 { sqlite3_value_type(value) }
    var integer: Int64 { sqlite3_value_int64(value) }
    var real: Double { sqlite3_value_double(value) }
    var text: UnsafePointer<UInt8>? { sqlite3_value_text(value) }
    var blob: UnsafeRawPointer? { sqlite3_value_blob(value) }
    var byteCount: Int { Int(sqlite3_value_bytes(value)) }
}
