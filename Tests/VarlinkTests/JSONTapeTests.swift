import Testing
@testable import VarlinkJSON

/// The one JSON scanner: what it accepts, what it refuses, and reading values in place.
struct JSONTapeTests {
    func parse(_ text: String, maxDepth: Int = 64) throws -> JSONValue {
        try JSONParser(maxDepth: maxDepth).parse(Array(text.utf8))
    }

    func refuses(_ bytes: [UInt8], maxDepth: Int = 64) -> Bool {
        (try? JSONParser(maxDepth: maxDepth).parse(bytes)) == nil
    }

    @Test func valuesKeepTheirExactTypes() throws {
        #expect(try parse("9223372036854775807") == .integer(.max))
        #expect(try parse("-9223372036854775808") == .integer(.min))
        #expect(try parse("9223372036854775808") == .real(9223372036854775808.0))
        #expect(try parse("-0") == .integer(0))
        #expect(try parse("2.0") == .real(2.0))
        #expect(try parse("1e3") == .real(1000))
        #expect(try parse(" [true, false, null, \"\"] ") == [true, false, nil, ""])
        #expect(try parse(#"{"a": {"b": [1, {"c": "d"}]}, "e": -1.5}"#) == ["a": ["b": [1, ["c": "d"]]], "e": -1.5])
        #expect(try parse(#"{"k": 1, "k": 2}"#) == ["k": 2])
    }

    /// Strings are skipped 8 bytes at a time while they hold nothing special: a quote, an
    /// escape, a control character or non-ASCII at any offset of a word, in strings of any
    /// length, must still be seen.
    @Test func everySpecialByteIsSeenAtEveryOffset() throws {
        for length in 0...40 {
            for offset in 0..<max(length, 1) where offset < length || length == 0 {
                let before = String(repeating: "a", count: offset), after = String(repeating: "b", count: max(length - offset - 1, 0))
                if length == 0 { #expect(try parse("\"\"") == .string("")); continue }
                // An escaped quote, an escaped backslash, a two-byte and a three-byte character.
                #expect(try parse("\"\(before)\\\"\(after)\"") == .string(before + "\"" + after))
                #expect(try parse("\"\(before)\\\\\(after)\"") == .string(before + "\\" + after))
                #expect(try parse("\"\(before)é\(after)\"") == .string(before + "é" + after))
                #expect(try parse("\"\(before)€\(after)\"") == .string(before + "€" + after))
                // The closing quote there: what follows is the next value.
                #expect(try parse("[\"\(before)\", \"\(after)\"]") == [.string(before), .string(after)])
                // Refused wherever they are.
                let plain = Array(("\"" + before + "x" + after + "\"").utf8)
                for bad: UInt8 in [0x00, 0x01, 0x0A, 0x1F, 0x80, 0xC3, 0xFF] {
                    var bytes = plain
                    bytes[1 + offset] = bad
                    #expect(refuses(bytes), "byte \(bad) at offset \(offset) of \(length) was accepted")
                }
                #expect(refuses(Array(("\"" + before).utf8)), "an unterminated string was accepted")
            }
        }
        #expect(try parse("\"\u{7F}~ !#[]\"") == .string("\u{7F}~ !#[]"))
    }

    @Test func escapesAndUnicodeDecode() throws {
        #expect(try parse(#""a\"b\\c\/d\b\f\n\r\t""#) == .string("a\"b\\c/d\u{8}\u{c}\n\r\t"))
        #expect(try parse(#""\u0000 \u00e9 \u20ac \ud83c\udf89""#) == .string("\u{0} é € 🎉"))
        #expect(try parse("\"ünïcödé 🎉\"") == .string("ünïcödé 🎉"))
    }

    @Test func badInputIsRefused() {
        let bad: [[UInt8]] = [
            Array("".utf8), Array("{".utf8), Array("[1,]".utf8), Array("{\"a\" 1}".utf8), Array("01".utf8),
            Array("1.".utf8), Array("1e".utf8), Array("-".utf8), Array("tru".utf8), Array("nul".utf8),
            Array("\"unterminated".utf8), Array("\"\\x\"".utf8), Array("\"\\u12\"".utf8), Array("1 2".utf8),
            Array("\"\\ud800\"".utf8), Array("\"\\udc00\"".utf8), Array("\"\\ud800\\u0041\"".utf8),
            [0x22, 0x01, 0x22], // control character
            [0x22, 0xC0, 0xAF, 0x22], // overlong "/"
            [0x22, 0xED, 0xA0, 0x80, 0x22], // an encoded surrogate
            [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22], // above U+10FFFF
            [0x22, 0xE2, 0x82, 0x22], // truncated sequence
            [0x22, 0xFF, 0x22],
            Array("{\"a\":1}x".utf8),
        ]
        for bytes in bad { #expect(refuses(bytes), "\(bytes)") }
    }

    @Test func nestingIsLimited() throws {
        let deep = String(repeating: "[", count: 10) + String(repeating: "]", count: 10)
        #expect(throws: Never.self) { try parse(deep, maxDepth: 10) }
        #expect(refuses(Array(deep.utf8), maxDepth: 9))
        let hostile = Array(repeating: UInt8(ascii: "["), count: 100_000)
        #expect(refuses(hostile))
    }

    @Test func aViewReadsMembersInPlace() throws {
        let text = #"{"method": "io.x.Y", "parameters": {"user": "al\u0069ce", "n": -42, "r": 2.5, "list": [1, "two", null], "big": 18446744073709551616}}"#
        let bytes = Array(text.utf8)
        var tape = JSONTape()
        try bytes.withUnsafeBufferPointer { try tape.parse($0) }
        try bytes.withUnsafeBufferPointer { buffer in
            try tape.withView(buffer) { view in
                let method = try #require(view.member("method", of: 0))
                #expect(view.stringEquals(method, "io.x.Y"))
                #expect(!view.stringEquals(method, "io.x.Z"))
                let parameters = try #require(view.member("parameters", of: 0))
                let user = try #require(view.member("user", of: parameters))
                #expect(view.stringEquals(user, "alice") && view.string(user) == "alice")
                #expect(view.integer(try #require(view.member("n", of: parameters))) == -42)
                let real = try #require(view.member("r", of: parameters))
                #expect(view.integer(real) == nil && view.double(real) == 2.5)
                #expect(view.integer(try #require(view.member("big", of: parameters))) == nil)
                let list = try #require(view.member("list", of: parameters))
                var kinds: [JSONToken.Kind] = []
                view.forEachElement(of: list) { _, element in kinds.append(view.kind(element)) }
                #expect(kinds == [.number, .string, .null])
                #expect(view.member("absent", of: parameters) == nil)
                #expect(view.member("user", of: user) == nil) // not an object
            }
        }
    }
}
