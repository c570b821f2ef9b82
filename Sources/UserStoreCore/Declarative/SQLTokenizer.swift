import Foundation

/// A token of SQLite's SQL, enough to take CREATE statements apart.
package struct SQLToken: Equatable {
    enum Kind: Equatable { case word, quotedIdentifier, string, number, blob, punctuation, comment }
    var kind: Kind
    /// The token's text as written (quotes included).
    package var text: String
    /// 1-based line of the token's first character.
    var line: Int
    /// Character offsets of the token in the text it came from.
    package var range: Range<Int> = 0..<0

    /// The identifier's value (quotes removed), or the word; lower-cased for comparisons.
    var identifier: String {
        switch kind {
        case .quotedIdentifier:
            let inner = text.dropFirst().dropLast()
            let quote = text.first!
            let closing: Character = quote == "[" ? "]" : quote
            return inner.replacingOccurrences(of: String([closing, closing]), with: String(closing)).lowercased()
        default:
            return text.lowercased()
        }
    }

    /// Normalised text for comparing definitions: identifiers and keywords lower-cased and
    /// unquoted, strings and numbers as written.
    var normalized: String {
        switch kind {
        case .word, .quotedIdentifier: return identifier
        default: return text
        }
    }
}

/// Splits SQL text into tokens (comments kept, whitespace dropped).
package enum SQLTokenizer {
    package static func tokens(_ sql: String) -> [SQLToken] {
        let chars = Array(sql)
        var tokens: [SQLToken] = []
        var index = 0
        var line = 1
        func take(_ kind: SQLToken.Kind, from start: Int, startLine: Int) {
            tokens.append(SQLToken(kind: kind, text: String(chars[start..<index]), line: startLine, range: start..<index))
        }
        while index < chars.count {
            let char = chars[index]
            let start = index, startLine = line
            if char == "\n" { line += 1; index += 1; continue }
            if char.isWhitespace { index += 1; continue }
            if char == "-", index + 1 < chars.count, chars[index + 1] == "-" {
                while index < chars.count, chars[index] != "\n" { index += 1 }
                take(.comment, from: start, startLine: startLine)
                continue
            }
            if char == "/", index + 1 < chars.count, chars[index + 1] == "*" {
                index += 2
                while index + 1 < chars.count, !(chars[index] == "*" && chars[index + 1] == "/") {
                    if chars[index] == "\n" { line += 1 }
                    index += 1
                }
                index = min(index + 2, chars.count)
                take(.comment, from: start, startLine: startLine)
                continue
            }
            if char == "'" || char == "\"" || char == "`" || char == "[" {
                let closing: Character = char == "[" ? "]" : char
                index += 1
                while index < chars.count {
                    if chars[index] == "\n" { line += 1 }
                    if chars[index] == closing {
                        if closing != "]", index + 1 < chars.count, chars[index + 1] == closing { index += 2; continue }
                        index += 1
                        break
                    }
                    index += 1
                }
                take(char == "'" ? .string : .quotedIdentifier, from: start, startLine: startLine)
                continue
            }
            if (char == "x" || char == "X"), index + 1 < chars.count, chars[index + 1] == "'" {
                index += 2
                while index < chars.count, chars[index] != "'" { index += 1 }
                index = min(index + 1, chars.count)
                take(.blob, from: start, startLine: startLine)
                continue
            }
            if char.isLetter || char == "_" {
                while index < chars.count, chars[index].isLetter || chars[index].isNumber || chars[index] == "_" || chars[index] == "$" { index += 1 }
                take(.word, from: start, startLine: startLine)
                continue
            }
            if char.isNumber || (char == "." && index + 1 < chars.count && chars[index + 1].isNumber) {
                while index < chars.count, chars[index].isNumber || chars[index] == "." || chars[index].isLetter
                        || ((chars[index] == "+" || chars[index] == "-") && (chars[index - 1] == "e" || chars[index - 1] == "E")) { index += 1 }
                take(.number, from: start, startLine: startLine)
                continue
            }
            // Two-character operators stay whole so normalised text is stable.
            if index + 1 < chars.count, ["<=", ">=", "<>", "!=", "==", "||", "<<", ">>"].contains(String([char, chars[index + 1]])) {
                index += 2
            } else {
                index += 1
            }
            take(.punctuation, from: start, startLine: startLine)
        }
        return tokens
    }

    /// The normalised text of `tokens` (no comments), for comparisons.
    static func normalized(_ tokens: some Sequence<SQLToken>) -> String {
        tokens.filter { $0.kind != .comment }.map(\.normalized).joined(separator: " ")
    }
}
