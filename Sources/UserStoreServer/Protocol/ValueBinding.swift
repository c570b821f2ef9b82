import Foundation
import GRDBSQLite
import Varlink

/// Binds JSON parameters to a prepared statement (see the value table in io.userstore.Store).
enum ValueBinding {
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// Binds `parameters` (nil, an array or an object) to `statement`.
    static func bind(_ parameters: JSONValue?, to statement: OpaquePointer, name: String = "parameters") throws(VarlinkError) {
        let count = Int(sqlite3_bind_parameter_count(statement))
        switch parameters {
        case nil, .null?:
            guard count == 0 else { throw .invalidParameter("\(name): the statement has \(count) parameter\(count == 1 ? "" : "s"), none given") }
        case .array(let values)?:
            guard values.count == count else {
                throw .invalidParameter("\(name): the statement has \(count) parameter\(count == 1 ? "" : "s"), \(values.count) given")
            }
            for (offset, value) in values.enumerated() {
                try bind(value, at: Int32(offset + 1), to: statement, name: "\(name)[\(offset)]")
            }
        case .object(let values)?:
            var used = 0
            for index in 1...max(count, 1) where count > 0 {
                guard let cName = sqlite3_bind_parameter_name(statement, Int32(index)) else {
                    throw .invalidParameter("\(name): the statement uses positional parameters; pass an array")
                }
                let full = String(cString: cName)
                let key = String(full.dropFirst())
                guard let value = values[key] ?? values[full] else { throw .invalidParameter("\(name).\(key)") }
                used += 1
                try bind(value, at: Int32(index), to: statement, name: "\(name).\(key)")
            }
            if used != values.count {
                let known = Set((1...max(count, 1)).compactMap { index in
                    sqlite3_bind_parameter_name(statement, Int32(index)).map { String(String(cString: $0).dropFirst()) }
                })
                let unknown = values.keys.filter { !known.contains($0) && !known.contains(String($0.dropFirst())) }.sorted()
                if let first = unknown.first { throw .invalidParameter("\(name).\(first)") }
            }
        default:
            throw .invalidParameter(name)
        }
    }

    private static func bind(_ value: JSONValue, at index: Int32, to statement: OpaquePointer, name: String) throws(VarlinkError) {
        let code: Int32
        switch value {
        case .null: code = sqlite3_bind_null(statement, index)
        case .bool(let flag): code = sqlite3_bind_int64(statement, index, flag ? 1 : 0)
        case .integer(let integer): code = sqlite3_bind_int64(statement, index, integer)
        case .real(let real): code = sqlite3_bind_double(statement, index, real)
        case .string(var text):
            if text.isEmpty {
                code = sqlite3_bind_text(statement, index, "", 0, transient)
            } else {
                code = text.withUTF8 { buffer in
                    buffer.withMemoryRebound(to: CChar.self) { chars in
                        sqlite3_bind_text64(statement, index, chars.baseAddress, UInt64(chars.count), transient, UInt8(SQLITE_UTF8))
                    }
                }
            }
        case .object(let tagged):
            guard tagged.count == 1, let (tag, inner) = tagged.first else { throw .invalidParameter(name) }
            switch (tag, inner) {
            case ("blob", .string(let base64)):
                guard let data = Data(base64Encoded: base64) else { throw .invalidParameter(name + ".blob") }
                code = data.withUnsafeBytes { sqlite3_bind_blob64(statement, index, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), UInt64($0.count), transient) }
            case ("integer", .integer(let integer)): code = sqlite3_bind_int64(statement, index, integer)
            case ("integer", .string(let text)):
                guard let integer = Int64(text) else { throw .invalidParameter(name + ".integer") }
                code = sqlite3_bind_int64(statement, index, integer)
            case ("real", .real(let real)): code = sqlite3_bind_double(statement, index, real)
            case ("real", .integer(let integer)): code = sqlite3_bind_double(statement, index, Double(integer))
            case ("text", .string):
                try bind(inner, at: index, to: statement, name: name)
                return
            case ("null", _): code = sqlite3_bind_null(statement, index)
            default: throw .invalidParameter(name)
            }
        case .array:
            throw .invalidParameter(name)
        }
        guard code == SQLITE_OK else { throw Errors.sqlError(code: code, message: String(cString: sqlite3_errstr(code))) }
    }
}
