import Foundation
import GRDBSQLite
import Varlink

/// Binds a call's JSON parameters to a prepared statement straight from the request's bytes
/// (see the value table in io.userstore.Store): no intermediate values, text bound from the
/// buffer it arrived in.
package enum ValueBinding {
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// Binds the parameters at token `parameters` of `view` (nil or null: none; an array:
    /// positional; an object: named) to `statement`.
    package static func bind(_ view: JSONView, _ parameters: Int?, to statement: OpaquePointer, name: String = "parameters") throws(VarlinkError) {
        let count = Int(sqlite3_bind_parameter_count(statement))
        guard let parameters, view.kind(parameters) != .null else {
            guard count == 0 else { throw .invalidParameter("\(name): the statement has \(count) parameter\(count == 1 ? "" : "s"), none given") }
            return
        }
        switch view.kind(parameters) {
        case .array:
            let given = view.count(parameters)
            guard given == count else {
                throw .invalidParameter("\(name): the statement has \(count) parameter\(count == 1 ? "" : "s"), \(given) given")
            }
            var failure: VarlinkError?
            view.forEachElement(of: parameters) { offset, element in
                guard failure == nil else { return }
                do throws(VarlinkError) {
                    try bind(view, element, at: Int32(offset + 1), to: statement) { "\(name)[\(offset)]" }
                } catch {
                    failure = error
                }
            }
            if let failure { throw failure }
        case .object:
            try bindNamed(view, parameters, count: count, to: statement, name: name)
        default:
            throw .invalidParameter(name)
        }
    }

    private static func bindNamed(_ view: JSONView, _ object: Int, count: Int, to statement: OpaquePointer, name: String) throws(VarlinkError) {
        for index in 0..<count {
            guard let cName = sqlite3_bind_parameter_name(statement, Int32(index + 1)) else {
                throw .invalidParameter("\(name): the statement uses positional parameters; pass an array")
            }
            let length = strlen(cName)
            let full = UnsafeBufferPointer(start: UnsafeRawPointer(cName).assumingMemoryBound(to: UInt8.self), count: length)
            let key = UnsafeBufferPointer(rebasing: full[1...])
            guard let value = view.member(key, of: object) ?? view.member(full, of: object) else {
                throw .invalidParameter("\(name).\(String(decoding: key, as: UTF8.self))")
            }
            try bind(view, value, at: Int32(index + 1), to: statement) { "\(name).\(String(decoding: key, as: UTF8.self))" }
        }
        guard view.count(object) != count else { return }
        // More members than parameters (or duplicates): every member must name a parameter.
        var unknown: [String] = []
        view.forEachMember(of: object) { member, _ in
            let text = view.string(member)
            let known = (0..<count).contains { index in
                guard let cName = sqlite3_bind_parameter_name(statement, Int32(index + 1)) else { return false }
                let full = String(cString: cName)
                return full == text || full.dropFirst() == Substring(text)
            }
            if !known { unknown.append(text) }
        }
        if let first = unknown.sorted().first { throw .invalidParameter("\(name).\(first)") }
    }

    private static func bind(_ view: JSONView, _ value: Int, at index: Int32, to statement: OpaquePointer,
                             name: () -> String) throws(VarlinkError) {
        let code: Int32
        switch view.kind(value) {
        case .null: code = sqlite3_bind_null(statement, index)
        case .true: code = sqlite3_bind_int64(statement, index, 1)
        case .false: code = sqlite3_bind_int64(statement, index, 0)
        case .number:
            if let integer = view.integer(value) {
                code = sqlite3_bind_int64(statement, index, integer)
            } else {
                code = sqlite3_bind_double(statement, index, view.double(value) ?? .nan)
            }
        case .string:
            code = bindText(view, value, at: index, to: statement)
        case .object:
            code = try bindTagged(view, value, at: index, to: statement, name: name)
        case .array:
            throw .invalidParameter(name())
        }
        guard code == SQLITE_OK else { throw Errors.sqlError(code: code, message: String(cString: sqlite3_errstr(code))) }
    }

    private static func bindText(_ view: JSONView, _ value: Int, at index: Int32, to statement: OpaquePointer) -> Int32 {
        view.withStringBytes(value) { bytes in
            // An empty buffer may have no address; SQLite needs one for an empty text.
            guard let base = bytes.baseAddress, bytes.count > 0 else { return sqlite3_bind_text(statement, index, "", 0, transient) }
            return base.withMemoryRebound(to: CChar.self, capacity: bytes.count) { chars in
                sqlite3_bind_text64(statement, index, chars, UInt64(bytes.count), transient, UInt8(SQLITE_UTF8))
            }
        }
    }

    /// `{"blob": base64}`, `{"integer": n | "n"}`, `{"real": n}`, `{"text": "..."}`, `{"null": any}`.
    private static func bindTagged(_ view: JSONView, _ object: Int, at index: Int32, to statement: OpaquePointer,
                                   name: () -> String) throws(VarlinkError) -> Int32 {
        guard view.count(object) == 1 else { throw .invalidParameter(name()) }
        let tag = object + 1, inner = object + 2
        let kind = view.kind(inner)
        if view.stringEquals(tag, "blob"), kind == .string {
            let text = view.withStringBytes(inner) { Data($0) }
            guard let data = Data(base64Encoded: text) else { throw .invalidParameter(name() + ".blob") }
            return data.withUnsafeBytes { sqlite3_bind_blob64(statement, index, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), UInt64($0.count), transient) }
        }
        if view.stringEquals(tag, "integer") {
            if let integer = view.integer(inner) { return sqlite3_bind_int64(statement, index, integer) }
            guard kind == .string, let integer = Int64(view.string(inner)) else {
                throw .invalidParameter(name() + (kind == .string ? ".integer" : ""))
            }
            return sqlite3_bind_int64(statement, index, integer)
        }
        if view.stringEquals(tag, "real"), kind == .number, let real = view.double(inner) {
            return sqlite3_bind_double(statement, index, real)
        }
        if view.stringEquals(tag, "text"), kind == .string { return bindText(view, inner, at: index, to: statement) }
        if view.stringEquals(tag, "null") { return sqlite3_bind_null(statement, index) }
        throw .invalidParameter(name())
    }
}
