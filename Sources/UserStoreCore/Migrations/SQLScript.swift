import GRDBSQLite

/// A SQL script split into complete statements, the way the `sqlite3` shell splits it.
///
/// Splitting uses `sqlite3_complete`, so a `;` inside a string, a comment or a
/// `CREATE TRIGGER … BEGIN … END` body never ends a statement early.
public struct SQLScript: Sendable, Equatable {
    /// The statements in order, each with its own leading comments and trailing `;`.
    public let statements: [String]
    /// Text after the last complete statement that is more than whitespace and comments
    /// (an unterminated statement), or nil.
    public let incompleteTail: String?

    /// Splits `text` into statements.
    public init(_ text: String) {
        var statements: [String] = []
        var current: [UInt8] = []
        for byte in text.utf8 {
            current.append(byte)
            guard byte == UInt8(ascii: ";") else { continue }
            let candidate = String(decoding: current, as: UTF8.self)
            let complete = candidate.withCString { sqlite3_complete($0) } != 0
            if complete {
                if SQLScript.firstKeyword(of: candidate) != nil { statements.append(candidate) }
                current.removeAll(keepingCapacity: true)
            }
        }
        let tail = String(decoding: current, as: UTF8.self)
        self.statements = statements
        self.incompleteTail = SQLScript.firstKeyword(of: tail) == nil ? nil : tail
    }

    /// `statement` on one line, without its comment lines and final `;`, cut to 60 characters:
    /// how messages quote a statement.
    public static func excerpt(of statement: String) -> String {
        let flat = statement.split(whereSeparator: \.isNewline).map { $0.trimmingWhitespace() }
            .filter { !$0.isEmpty && !$0.hasPrefix("--") }.joined(separator: " ")
        let trimmed = flat.hasSuffix(";") ? String(flat.dropLast()) : flat
        return trimmed.count > 60 ? String(trimmed.prefix(57)) + "..." : trimmed
    }

    /// The first keyword of `statement`, upper-cased, skipping whitespace and comments;
    /// nil when the text holds nothing but whitespace, comments and `;`.
    public static func firstKeyword(of statement: String) -> String? {
        keywords(of: statement, count: 1).first
    }

    /// Up to `count` leading words of `statement`, upper-cased, skipping comments.
    /// Quoted identifiers and strings end the scan: keywords come before them.
    public static func keywords(of statement: String, count: Int) -> [String] {
        var words: [String] = []
        var word = ""
        var iterator = Array(statement.utf8)[...]
        func flush() {
            if !word.isEmpty { words.append(word.uppercased()); word = "" }
        }
        while let byte = iterator.first, words.count < count {
            if byte == UInt8(ascii: "-"), iterator.dropFirst().first == UInt8(ascii: "-") {
                flush()
                while let next = iterator.first, next != UInt8(ascii: "\n") { iterator = iterator.dropFirst() }
                continue
            }
            if byte == UInt8(ascii: "/"), iterator.dropFirst().first == UInt8(ascii: "*") {
                flush()
                iterator = iterator.dropFirst(2)
                while !iterator.isEmpty, !(iterator.first == UInt8(ascii: "*") && iterator.dropFirst().first == UInt8(ascii: "/")) {
                    iterator = iterator.dropFirst()
                }
                iterator = iterator.dropFirst(2)
                continue
            }
            let isWordByte = (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || (byte >= 0x30 && byte <= 0x39) || byte == UInt8(ascii: "_")
            if isWordByte {
                word.append(Character(UnicodeScalar(byte)))
            } else {
                flush()
                if byte == UInt8(ascii: "'") || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "`") || byte == UInt8(ascii: "[") {
                    break
                }
            }
            iterator = iterator.dropFirst()
        }
        if words.count < count { flush() }
        return Array(words.prefix(count))
    }
}
