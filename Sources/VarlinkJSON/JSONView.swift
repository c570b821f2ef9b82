#if canImport(Glibc)
import Glibc
#endif

/// Read access to a parsed document (``JSONTape``) and its bytes, without copying either.
///
/// Valid only inside the closure that provides it (``JSONTape/withView(_:_:)``,
/// ``JSONMessage/withView(_:)``). Token indexes come from the view's own methods; the root is 0.
public struct JSONView {
    public let bytes: UnsafeBufferPointer<UInt8>
    public let tokens: UnsafeBufferPointer<JSONToken>

    public init(bytes: UnsafeBufferPointer<UInt8>, tokens: UnsafeBufferPointer<JSONToken>) {
        self.bytes = bytes
        self.tokens = tokens
    }

    /// The kind of token `index`.
    public func kind(_ index: Int) -> JSONToken.Kind { tokens[index].kind }

    /// The value of member `name` of the object at `object`, or nil (also when `object` is not an
    /// object). With duplicate names the last one wins, as when the object is read as a whole.
    public func member(_ name: StaticString, of object: Int) -> Int? {
        member(UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount), of: object)
    }

    /// The value of member `name` of the object at `object`, or nil.
    public func member(_ name: UnsafeBufferPointer<UInt8>, of object: Int) -> Int? {
        guard tokens[object].kind == .object else { return nil }
        var found: Int?
        var key = object + 1
        for _ in 0..<tokens[object].count {
            let value = key + 1
            if stringEquals(key, name) { found = value }
            key = Int(tokens[value].next)
        }
        return found
    }

    /// Calls `body` with each member of the object at `object`: its name's token and its value's.
    public func forEachMember(of object: Int, _ body: (_ name: Int, _ value: Int) throws -> Void) rethrows {
        var key = object + 1
        for _ in 0..<tokens[object].count {
            try body(key, key + 1)
            key = Int(tokens[key + 1].next)
        }
    }

    /// Calls `body` with each element of the array at `array` and its position.
    public func forEachElement(of array: Int, _ body: (_ offset: Int, _ element: Int) throws -> Void) rethrows {
        var element = array + 1
        for offset in 0..<Int(tokens[array].count) {
            try body(offset, element)
            element = Int(tokens[element].next)
        }
    }

    /// How many elements or members the container at `index` has.
    public func count(_ index: Int) -> Int { Int(tokens[index].count) }

    /// Whether the string at `index` is exactly `text` (after unescaping).
    public func stringEquals(_ index: Int, _ text: StaticString) -> Bool {
        stringEquals(index, UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Whether the string at `index` is exactly `text` (after unescaping).
    public func stringEquals(_ index: Int, _ text: UnsafeBufferPointer<UInt8>) -> Bool {
        let token = tokens[index]
        guard token.kind == .string else { return false }
        if !token.flag {
            let count = Int(token.end - token.start)
            guard count == text.count else { return false }
            return count == 0 || memcmp(bytes.baseAddress! + Int(token.start), text.baseAddress!, count) == 0
        }
        return withStringBytes(index) { $0.elementsEqual(text) }
    }

    /// Calls `body` with the UTF-8 of the string at `index`, unescaped (the bytes in place when
    /// the string has no escapes, a temporary copy otherwise).
    public func withStringBytes<T, E: Error>(_ index: Int, _ body: (UnsafeBufferPointer<UInt8>) throws(E) -> T) throws(E) -> T {
        let token = tokens[index]
        let raw = UnsafeBufferPointer(rebasing: bytes[Int(token.start)..<Int(token.end)])
        guard token.flag else { return try body(raw) }
        var unescaped: [UInt8] = []
        unescaped.reserveCapacity(raw.count)
        Self.unescape(raw, into: &unescaped)
        return try unescaped.withUnsafeBufferPointer { buffer throws(E) in try body(buffer) }
    }

    /// The JSON text of the value at `index`, exactly as it came (a string with its quotes and
    /// escapes): for passing a value on without decoding it.
    public func rawText(_ index: Int) -> UnsafeBufferPointer<UInt8> {
        let token = tokens[index]
        let quote = token.kind == .string ? 1 : 0
        return UnsafeBufferPointer(rebasing: bytes[Int(token.start) - quote..<Int(token.end) + quote])
    }

    /// The text of the string at `index`.
    public func string(_ index: Int) -> String {
        withStringBytes(index) { String(decoding: $0, as: UTF8.self) }
    }

    /// The integer at `index`, or nil when it is not a number without fraction or exponent that
    /// fits 64 bits.
    public func integer(_ index: Int) -> Int64? {
        let token = tokens[index]
        guard token.kind == .number, !token.flag else { return nil }
        return Self.integer(bytes, from: Int(token.start), to: Int(token.end))
    }

    /// Whether the number at `index` is written as an integer (no fraction or exponent) too large
    /// for 64 bits: the scanner reads it as a real, but what the writer meant was an integer.
    public func isOutOfRangeInteger(_ index: Int) -> Bool {
        let token = tokens[index]
        guard token.kind == .number, token.flag else { return false }
        return !bytes[Int(token.start)..<Int(token.end)].contains { $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") }
    }

    /// The number at `index` as a double (integers too), or nil when it is not a number.
    public func double(_ index: Int) -> Double? {
        let token = tokens[index]
        guard token.kind == .number else { return nil }
        if !token.flag, let integer = integer(index) { return Double(integer) }
        return Double(String(decoding: UnsafeBufferPointer(rebasing: bytes[Int(token.start)..<Int(token.end)]), as: UTF8.self))
    }

    /// The boolean at `index`, or nil.
    public func bool(_ index: Int) -> Bool? {
        switch tokens[index].kind {
        case .true: return true
        case .false: return false
        default: return nil
        }
    }

    /// The token at `index` and everything in it as a ``JSONValue``.
    public func value(_ index: Int) -> JSONValue {
        let token = tokens[index]
        switch token.kind {
        case .null: return .null
        case .true: return .bool(true)
        case .false: return .bool(false)
        case .string: return .string(string(index))
        case .number:
            if let integer = integer(index) { return .integer(integer) }
            return .real(double(index) ?? .nan)
        case .array:
            var elements: [JSONValue] = []
            elements.reserveCapacity(Int(token.count))
            forEachElement(of: index) { _, element in elements.append(value(element)) }
            return .array(elements)
        case .object:
            var members: [String: JSONValue] = [:]
            members.reserveCapacity(Int(token.count))
            forEachMember(of: index) { name, member in members[string(name)] = value(member) }
            return .object(members)
        }
    }

    // MARK: Decoding helpers (also used by the scanner)

    /// The integer written in `bytes[start..<end]` (already checked to be a JSON number without
    /// fraction or exponent), or nil when it does not fit 64 bits.
    static func integer(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int, to end: Int) -> Int64? {
        var index = start
        let negative = bytes[index] == UInt8(ascii: "-")
        if negative { index += 1 }
        var value: Int64 = 0
        while index < end {
            let digit = Int64(bytes[index] &- UInt8(ascii: "0"))
            // Accumulated as a negative number: Int64.min has no positive counterpart.
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (next, overflow2) = shifted.subtractingReportingOverflow(digit)
            if overflow1 || overflow2 { return nil }
            value = next
            index += 1
        }
        if negative { return value }
        return value == .min ? nil : -value
    }

    /// The value of four hex digits at `index`, or nil.
    static func hex4(_ bytes: UnsafeBufferPointer<UInt8>, at index: Int) -> UInt32? {
        guard index + 4 <= bytes.count else { return nil }
        var value: UInt32 = 0
        for offset in 0..<4 {
            let byte = bytes[index + offset]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: return nil
            }
            value = value << 4 | digit
        }
        return value
    }

    /// Appends the UTF-8 of a string's raw text (checked by the scanner) with its escapes resolved.
    static func unescape(_ raw: UnsafeBufferPointer<UInt8>, into out: inout [UInt8]) {
        var index = 0
        while index < raw.count {
            let byte = raw[index]
            guard byte == UInt8(ascii: "\\") else {
                out.append(byte)
                index += 1
                continue
            }
            let escaped = raw[index + 1]
            index += 2
            switch escaped {
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = hex4(raw, at: index)!
                index += 4
                if (0xD800...0xDBFF).contains(scalar) {
                    let low = hex4(raw, at: index + 2)!
                    index += 6
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                }
                appendUTF8(scalar, to: &out)
            default: out.append(escaped) // " \ /
            }
        }
    }

    private static func appendUTF8(_ scalar: UInt32, to out: inout [UInt8]) {
        switch scalar {
        case ..<0x80:
            out.append(UInt8(scalar))
        case ..<0x800:
            out.append(UInt8(0xC0 | scalar >> 6))
            out.append(UInt8(0x80 | scalar & 0x3F))
        case ..<0x10000:
            out.append(UInt8(0xE0 | scalar >> 12))
            out.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            out.append(UInt8(0x80 | scalar & 0x3F))
        default:
            out.append(UInt8(0xF0 | scalar >> 18))
            out.append(UInt8(0x80 | scalar >> 12 & 0x3F))
            out.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            out.append(UInt8(0x80 | scalar & 0x3F))
        }
    }
}

/// A message and its parsed tape, owned: for requests that outlive the buffer they arrived in
/// (queued work, async handlers).
public struct JSONMessage: Sendable {
    public let bytes: [UInt8]
    public let tape: JSONTape

    /// Parses `bytes`.
    public init(bytes: [UInt8], maxDepth: Int = 64) throws(JSONParseError) {
        var tape = JSONTape(maxDepth: maxDepth)
        try bytes.withUnsafeBufferPointer { buffer throws(JSONParseError) in try tape.parse(buffer) }
        self.bytes = bytes
        self.tape = tape
    }

    /// Takes `bytes` already parsed into `tape`.
    public init(bytes: [UInt8], parsed tape: JSONTape) {
        self.bytes = bytes
        self.tape = tape
    }

    /// A copy of the message `view` reads (for work that outlives the buffer it arrived in).
    public init(copying view: JSONView) {
        self.bytes = Array(view.bytes)
        self.tape = JSONTape(tokens: Array(view.tokens))
    }

    /// Runs `body` with a view of the message.
    public func withView<T, E: Error>(_ body: (JSONView) throws(E) -> T) throws(E) -> T {
        try bytes.withUnsafeBufferPointer { buffer throws(E) in try tape.withView(buffer, body) }
    }
}
