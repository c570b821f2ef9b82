/// Appends JSON to a byte array, fast, with exact numbers: integers as integer literals, reals
/// always with a fraction or exponent (`2.0`, `1e+16`) so a reader can tell them apart.
public struct JSONWriter: Sendable {
    /// The JSON written so far.
    public var bytes: [UInt8]

    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// Appends raw, already-valid JSON (or punctuation).
    @inlinable
    public mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    @inlinable
    public mutating func raw(byte: UInt8) {
        bytes.append(byte)
    }

    public mutating func write(_ value: JSONValue) {
        switch value {
        case .null: raw("null")
        case .bool(let flag): flag ? raw("true") : raw("false")
        case .integer(let integer): write(integer)
        case .real(let real): write(real)
        case .string(let text): write(text)
        case .array(let elements):
            raw(byte: UInt8(ascii: "["))
            for (offset, element) in elements.enumerated() {
                if offset > 0 { raw(byte: UInt8(ascii: ",")) }
                write(element)
            }
            raw(byte: UInt8(ascii: "]"))
        case .object(let members):
            raw(byte: UInt8(ascii: "{"))
            for (offset, key) in members.keys.sorted().enumerated() {
                if offset > 0 { raw(byte: UInt8(ascii: ",")) }
                write(key)
                raw(byte: UInt8(ascii: ":"))
                write(members[key]!)
            }
            raw(byte: UInt8(ascii: "}"))
        }
    }

    public mutating func write(_ integer: Int64) {
        if integer >= 0 && integer < 10 {
            bytes.append(UInt8(ascii: "0") + UInt8(integer))
            return
        }
        bytes.append(contentsOf: String(integer).utf8)
    }

    /// Writes a real. Infinities become `±1e999` (which every JSON reader turns back into an
    /// infinity); NaN, which SQLite never stores, becomes `null`.
    public mutating func write(_ real: Double) {
        if real.isNaN { raw("null"); return }
        if real.isInfinite { real > 0 ? raw("1e999") : raw("-1e999"); return }
        // Swift's description is the shortest text that reads back to the same double, and
        // always has a "." or an "e" for a double ("2.0", "1e-07", "1e+16").
        bytes.append(contentsOf: real.description.utf8)
    }

    /// Writes a string with JSON escapes; every byte of the UTF-8, NUL included, is kept.
    public mutating func write(_ text: String) {
        var text = text
        text.withUTF8 { writeString(utf8: $0) }
    }

    public mutating func writeString(utf8: UnsafeBufferPointer<UInt8>) {
        bytes.append(UInt8(ascii: "\""))
        var runStart = 0
        for index in 0..<utf8.count {
            let byte = utf8[index]
            guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
            if index > runStart { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<index])) }
            switch byte {
            case UInt8(ascii: "\""): raw("\\\"")
            case UInt8(ascii: "\\"): raw("\\\\")
            case 0x0A: raw("\\n")
            case 0x0D: raw("\\r")
            case 0x09: raw("\\t")
            default:
                let digits: [UInt8] = Array("0123456789abcdef".utf8)
                raw("\\u00")
                bytes.append(digits[Int(byte >> 4)])
                bytes.append(digits[Int(byte & 0x0F)])
            }
            runStart = index + 1
        }
        if runStart < utf8.count { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<utf8.count])) }
        bytes.append(UInt8(ascii: "\""))
    }
}
