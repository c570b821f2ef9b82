/// One token of a parsed JSON document: where it is in the bytes and what it is.
public struct JSONToken: Sendable, Equatable {
    public enum Kind: UInt8, Sendable {
        case object, array, string, number, `true`, `false`, null
    }

    /// What the token is.
    public var kind: Kind
    /// Strings: the text holds escapes (read it with ``JSONView/string(_:)``). Numbers: the
    /// text has a fraction or an exponent, or does not fit 64 bits (it is a real).
    public var flag: Bool
    /// First byte: a string's first byte after its opening quote; a container's bracket.
    public var start: UInt32
    /// One past the last byte: a string's closing quote; a container's closing bracket + 1.
    public var end: UInt32
    /// The index of the token after this one and everything inside it.
    public var next: UInt32
    /// Containers: elements of an array, members of an object (a member is two tokens: its
    /// name, a string, then its value).
    public var count: UInt32
}

/// A JSON document parsed into a flat list of tokens over its bytes (the "tape").
///
/// The one JSON parser of the project: strict RFC 8259 (UTF-8 checked, escapes and surrogate
/// pairs checked, no trailing text) with a nesting limit, so hostile input is refused before
/// anything reads it. Parsing allocates nothing once ``tokens`` has grown to fit the messages
/// a connection sends: the hot request path reads method, user, SQL and parameters straight from
/// the bytes through a ``JSONView``, and only slower paths build ``JSONValue``s from it.
public struct JSONTape: Sendable {
    /// Deepest nesting accepted.
    public var maxDepth: Int
    /// The tokens of the last document parsed, in document order; the first is the root.
    public private(set) var tokens: [JSONToken] = []

    /// - Parameter reservingTokens: room for this many tokens before the first parse grows it
    ///   (a tape parsing one small document spares itself the doubling from empty).
    public init(maxDepth: Int = 64, reservingTokens: Int = 0) {
        self.maxDepth = maxDepth
        tokens.reserveCapacity(reservingTokens)
    }

    /// A tape holding `tokens` (copied from another tape's view).
    init(tokens: [JSONToken]) {
        self.maxDepth = 0
        self.tokens = tokens
    }

    /// Parses exactly one JSON value (surrounded by optional whitespace) from `bytes`,
    /// replacing the tokens of the previous document.
    public mutating func parse(_ bytes: UnsafeBufferPointer<UInt8>) throws(JSONParseError) {
        guard bytes.count < Int(UInt32.max) else { throw JSONParseError(reason: "document too large", offset: 0) }
        tokens.removeAll(keepingCapacity: true)
        var scanner = Scanner(bytes: bytes, maxDepth: maxDepth, tokens: tokens)
        tokens = []
        defer { tokens = scanner.tokens }
        try scanner.parseDocument()
    }

    /// Runs `body` with a view of the last document parsed, whose bytes are `bytes` (the same
    /// bytes given to ``parse(_:)``).
    public func withView<T, E: Error>(_ bytes: UnsafeBufferPointer<UInt8>, _ body: (JSONView) throws(E) -> T) throws(E) -> T {
        try tokens.withUnsafeBufferPointer { tokens throws(E) in try body(JSONView(bytes: bytes, tokens: tokens)) }
    }

    private struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        let maxDepth: Int
        var tokens: [JSONToken]
        var index = 0
        var depth = 0

        init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int, tokens: [JSONToken]) {
            self.bytes = bytes
            self.maxDepth = maxDepth
            self.tokens = tokens
        }

        mutating func parseDocument() throws(JSONParseError) {
            skipWhitespace()
            try parseValue()
            skipWhitespace()
            guard index == bytes.count else { throw fail("unexpected text after the value") }
        }

        func fail(_ reason: String) -> JSONParseError { JSONParseError(reason: reason, offset: index) }

        mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        mutating func append(_ kind: JSONToken.Kind, flag: Bool = false, start: Int, end: Int) {
            tokens.append(JSONToken(kind: kind, flag: flag, start: UInt32(start), end: UInt32(end),
                                    next: UInt32(tokens.count + 1), count: 0))
        }

        mutating func parseValue() throws(JSONParseError) {
            guard index < bytes.count else { throw fail("unexpected end of input") }
            switch bytes[index] {
            case UInt8(ascii: "{"): try parseContainer(.object)
            case UInt8(ascii: "["): try parseContainer(.array)
            case UInt8(ascii: "\""): try parseString()
            case UInt8(ascii: "t"): try literal("true", .true)
            case UInt8(ascii: "f"): try literal("false", .false)
            case UInt8(ascii: "n"): try literal("null", .null)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try parseNumber()
            default: throw fail("unexpected character")
            }
        }

        mutating func literal(_ text: StaticString, _ kind: JSONToken.Kind) throws(JSONParseError) {
            let count = text.utf8CodeUnitCount
            guard index + count <= bytes.count else { throw fail("unexpected end of input") }
            let expected = text.utf8Start
            for offset in 0..<count where bytes[index + offset] != expected[offset] { throw fail("invalid literal") }
            append(kind, start: index, end: index + count)
            index += count
        }

        mutating func parseContainer(_ kind: JSONToken.Kind) throws(JSONParseError) {
            depth += 1
            guard depth <= maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
            let slot = tokens.count
            let start = index
            append(kind, start: start, end: start)
            let close = kind == .object ? UInt8(ascii: "}") : UInt8(ascii: "]")
            index += 1
            var count: UInt32 = 0
            skipWhitespace()
            if index < bytes.count, bytes[index] == close {
                index += 1
            } else {
                while true {
                    skipWhitespace()
                    if kind == .object {
                        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a member name") }
                        try parseString()
                        skipWhitespace()
                        guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                        index += 1
                        skipWhitespace()
                    }
                    try parseValue()
                    count += 1
                    skipWhitespace()
                    guard index < bytes.count else { throw fail("unexpected end of input") }
                    if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                    if bytes[index] == close { index += 1; break }
                    throw fail(kind == .object ? "expected ',' or '}'" : "expected ',' or ']'")
                }
            }
            depth -= 1
            tokens[slot].end = UInt32(index)
            tokens[slot].next = UInt32(tokens.count)
            tokens[slot].count = count
        }

        mutating func parseString() throws(JSONParseError) {
            index += 1 // the opening quote
            let start = index
            var escaped = false
            skipPlainBytes()
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    append(.string, flag: escaped, start: start, end: index)
                    index += 1
                    return
                }
                if byte == UInt8(ascii: "\\") {
                    escaped = true
                    try checkEscape()
                    skipPlainBytes()
                } else if byte < 0x20 {
                    throw fail("control character in string")
                } else if byte < 0x80 {
                    index += 1
                } else {
                    guard let length = UTF8Check.sequenceLength(bytes, at: index) else { throw fail("invalid UTF-8 in string") }
                    index += length
                }
            }
            throw fail("unterminated string")
        }

        /// Moves `index` past whole words of 8 plain string bytes (printable ASCII but `"` and
        /// `\\`), which need no look one by one: most of a request is such bytes. A word with
        /// anything else (or a false alarm) is left to the byte loop.
        @inline(__always)
        mutating func skipPlainBytes() {
            let ones: UInt64 = 0x0101_0101_0101_0101, highs: UInt64 = 0x8080_8080_8080_8080
            /// Whether any byte of `word` is zero (no false negatives).
            @inline(__always) func anyZero(_ word: UInt64) -> Bool { (word &- ones) & ~word & highs != 0 }
            while index + 8 <= bytes.count {
                let word = UnsafeRawPointer(bytes.baseAddress! + index).loadUnaligned(as: UInt64.self)
                let special = word & highs != 0 // non-ASCII
                    || (word &- 0x20 &* ones) & ~word & highs != 0 // a control character (< 0x20)
                    || anyZero(word ^ (0x22 &* ones)) // "
                    || anyZero(word ^ (0x5C &* ones)) // \
                if special { return }
                index += 8
            }
        }

        /// Checks the escape at `index` (a backslash) and moves past it.
        mutating func checkEscape() throws(JSONParseError) {
            index += 1
            guard index < bytes.count else { throw fail("unexpected end of input") }
            let escaped = bytes[index]
            index += 1
            switch escaped {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                 UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                return
            case UInt8(ascii: "u"):
                guard let scalar = JSONView.hex4(bytes, at: index) else { throw fail("invalid \\u escape") }
                index += 4
                if (0xD800...0xDBFF).contains(scalar) {
                    guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u"),
                          let low = JSONView.hex4(bytes, at: index + 2), (0xDC00...0xDFFF).contains(low) else {
                        throw fail("unpaired surrogate")
                    }
                    index += 6
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw fail("unpaired surrogate")
                }
            default:
                index -= 1
                throw fail("invalid escape")
            }
        }

        mutating func parseNumber() throws(JSONParseError) {
            let start = index
            var isReal = false
            if bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
            } else if (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(bytes[index]) {
                skipDigits()
            } else {
                throw fail("invalid number")
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                isReal = true
                index += 1
                guard skipDigits() else { throw fail("invalid number") }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                isReal = true
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard skipDigits() else { throw fail("invalid number") }
            }
            // Integers beyond 64 bits become reals, as SQLite itself treats them.
            if !isReal, JSONView.integer(bytes, from: start, to: index) == nil { isReal = true }
            append(.number, flag: isReal, start: start, end: index)
        }

        /// Moves past decimal digits; false when there were none.
        @discardableResult
        mutating func skipDigits() -> Bool {
            let first = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            return index > first
        }
    }
}

/// Checks UTF-8 sequences (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
enum UTF8Check {
    /// The length of the valid multi-byte sequence starting at `index`, or nil.
    static func sequenceLength(_ bytes: UnsafeBufferPointer<UInt8>, at index: Int) -> Int? {
        let lead = bytes[index]
        let length: Int
        var low: UInt8 = 0x80, high: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; high = 0x9F
        case 0xF0: length = 4; low = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; high = 0x8F
        default: return nil
        }
        guard index + length <= bytes.count else { return nil }
        guard (low...high).contains(bytes[index + 1]) else { return nil }
        for offset in 2..<length where !(0x80...0xBF).contains(bytes[index + offset]) { return nil }
        return length
    }
}
