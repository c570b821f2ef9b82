import Testing
@testable import Varlink

/// How an error quotes a refused input: whole up to 64 bytes, else its first whole characters
/// within 64 bytes and its length.
struct InputQuoteTests {
    @Test func shortInputsAreQuotedWhole() {
        let exact = String(repeating: "a", count: 64)
        #expect(InputQuote.prefix(exact) == exact)
        #expect(InputQuote.prefix("") == "")
    }

    @Test func longInputsAreCutAtACharacterBoundaryWithTheirLength() {
        #expect(InputQuote.prefix(String(repeating: "a", count: 10_000)) == String(repeating: "a", count: 64) + "... (10000 bytes)")
        // 63 ASCII bytes, then a 2-byte é that the 64-byte limit would split: left out whole.
        let split = String(repeating: "a", count: 63) + String(repeating: "é", count: 10)
        #expect(InputQuote.prefix(split) == String(repeating: "a", count: 63) + "... (83 bytes)")
        // 4-byte scalars: 16 of them fill the 64 bytes exactly.
        #expect(InputQuote.prefix(String(repeating: "😀", count: 20)) == String(repeating: "😀", count: 16) + "... (80 bytes)")
    }
}
