import Foundation
import Varlink

/// A varlink call written straight to the bytes that go on the wire (no `JSONValue` tree, no
/// dictionary): `{"method":…,"parameters":{…}}` and its NUL.
struct CallMessage {
    private var writer = JSONWriter(capacity: 256)
    private var firstField = true

    init(method: String) {
        writer.raw("{\"method\":")
        writer.write(method)
        writer.raw(",\"parameters\":{")
    }

    private mutating func name(_ name: StaticString) {
        if !firstField { writer.raw(byte: UInt8(ascii: ",")) }
        firstField = false
        writer.raw(byte: UInt8(ascii: "\""))
        writer.raw(name)
        writer.raw("\":")
    }

    mutating func field(_ name: StaticString, _ text: String) {
        self.name(name)
        writer.write(text)
    }

    mutating func field(_ name: StaticString, _ flag: Bool) {
        self.name(name)
        flag ? writer.raw("true") : writer.raw("false")
    }

    mutating func field(_ name: StaticString, _ integer: Int64) {
        self.name(name)
        writer.write(integer)
    }

    mutating func field(_ name: StaticString, _ texts: [String]) {
        self.name(name)
        writer.raw(byte: UInt8(ascii: "["))
        for (offset, text) in texts.enumerated() {
            if offset > 0 { writer.raw(byte: UInt8(ascii: ",")) }
            writer.write(text)
        }
        writer.raw(byte: UInt8(ascii: "]"))
    }

    /// `sql` and, when there are any, `parameters`.
    mutating func statement(_ statement: Statement) {
        name("sql")
        writeStatement(statement)
    }

    /// `statements`: a Batch's list.
    mutating func statements(_ statements: [Statement]) {
        name("statements")
        writer.raw(byte: UInt8(ascii: "["))
        for (offset, statement) in statements.enumerated() {
            if offset > 0 { writer.raw(byte: UInt8(ascii: ",")) }
            writer.raw("{\"sql\":")
            writeStatement(statement)
            writer.raw(byte: UInt8(ascii: "}"))
        }
        writer.raw(byte: UInt8(ascii: "]"))
    }

    /// The value of `sql`, then `,"parameters":…` when there are any.
    private mutating func writeStatement(_ statement: Statement) {
        writer.write(statement.sql)
        switch statement.parameters {
        case .positional(let values):
            guard !values.isEmpty else { return }
            writer.raw(",\"parameters\":[")
            for (offset, value) in values.enumerated() {
                if offset > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                write(value)
            }
            writer.raw(byte: UInt8(ascii: "]"))
        case .named(let values):
            writer.raw(",\"parameters\":{")
            // Sorted, so one call always makes the same bytes (the daemon caches statements by them).
            for (offset, key) in values.keys.sorted().enumerated() {
                if offset > 0 { writer.raw(byte: UInt8(ascii: ",")) }
                writer.write(key)
                writer.raw(byte: UInt8(ascii: ":"))
                write(values[key]!)
            }
            writer.raw(byte: UInt8(ascii: "}"))
        }
    }

    /// A value as the daemon binds it exactly: integers as integer literals, reals always with a
    /// fraction or exponent, blobs as `{"blob": base64}`.
    private mutating func write(_ value: SQLValue) {
        switch value {
        case .null: writer.raw("null")
        case .integer(let integer): writer.write(integer)
        case .real(let real): writer.write(real)
        case .text(let text): writer.write(text)
        case .blob(let data):
            writer.raw("{\"blob\":")
            writer.write(data.base64EncodedString())
            writer.raw(byte: UInt8(ascii: "}"))
        }
    }

    /// The finished message (with `"more":true` for a streamed call) and its NUL.
    consuming func finish(more: Bool = false) -> [UInt8] {
        writer.raw(byte: UInt8(ascii: "}"))
        if more { writer.raw(",\"more\":true") }
        writer.raw(byte: UInt8(ascii: "}"))
        writer.raw(byte: 0)
        return writer.bytes
    }
}
