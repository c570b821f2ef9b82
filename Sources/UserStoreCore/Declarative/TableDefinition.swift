import Foundation

/// A CREATE TABLE statement taken apart: columns and table constraints, compared structurally
/// (column order and whitespace do not matter; a column added with ADD COLUMN compares equal
/// to the same column written in the CREATE TABLE statement).
struct TableDefinition: Sendable, Equatable {
    struct Column: Sendable, Equatable {
        /// Lower-cased, unquoted.
        var name: String
        /// The definition after the name, normalised.
        var definition: String
        /// The whole column definition as SQL (for ADD COLUMN).
        var sql: String
        /// `-- renamed from: old` on the column's line.
        var renamedFrom: String?
    }

    var name: String
    var columns: [Column]
    /// Normalised table constraints (PRIMARY KEY, UNIQUE, CHECK, FOREIGN KEY), compared as a set.
    var constraints: [String]
    /// Normalised text after the closing parenthesis (WITHOUT ROWID, STRICT).
    var options: String
    /// `-- renamed from: old` on the CREATE TABLE line.
    var renamedFrom: String?
    /// The statement as written.
    var sql: String
    /// Character range of the table name in ``sql``.
    var nameRange: Range<Int>

    func column(_ name: String) -> Column? { columns.first { $0.name == name } }

    /// Whether the two define the same table (ignoring annotations and column order).
    func sameShape(as other: TableDefinition) -> Bool {
        Dictionary(uniqueKeysWithValues: columns.map { ($0.name, $0.definition) })
            == Dictionary(uniqueKeysWithValues: other.columns.map { ($0.name, $0.definition) })
            && Set(constraints) == Set(other.constraints) && options == other.options
    }

    /// ``sql`` with the table renamed to `newName`.
    func sql(renamedTo newName: String) -> String {
        let characters = Array(sql)
        return String(characters[..<nameRange.lowerBound]) + quote(newName) + String(characters[nameRange.upperBound...])
    }

    static let constraintKeywords: Set<String> = ["constraint", "primary", "unique", "check", "foreign"]

    /// Parses `CREATE [TEMP] TABLE [IF NOT EXISTS] [schema.]name (...) options`; nil for
    /// anything else (CREATE TABLE ... AS SELECT, virtual tables).
    static func parse(_ sql: String) -> TableDefinition? {
        let tokens = SQLTokenizer.tokens(sql)
        let code = tokens.enumerated().filter { $0.element.kind != .comment }
        var position = 0
        func word(_ offset: Int) -> String? { offset < code.count ? code[offset].element.identifier : nil }
        guard word(0) == "create" else { return nil }
        position = 1
        if word(position) == "temp" || word(position) == "temporary" { position += 1 }
        guard word(position) == "table" else { return nil }
        position += 1
        if word(position) == "if", word(position + 1) == "not", word(position + 2) == "exists" { position += 3 }
        guard position < code.count else { return nil }
        var nameToken = code[position].element
        if word(position + 1) == ".", position + 2 < code.count {
            position += 2
            nameToken = code[position].element
        }
        position += 1
        guard word(position) == "(" else { return nil }
        let createLine = code[0].element.line

        // Split the body at top-level commas.
        var segments: [[SQLToken]] = [[]]
        var depth = 0
        var index = code[position].offset + 1
        var closing = tokens.count
        while index < tokens.count {
            let token = tokens[index]
            if token.kind == .punctuation {
                if token.text == "(" { depth += 1 }
                if token.text == ")" {
                    if depth == 0 { closing = index; break }
                    depth -= 1
                }
                if token.text == ",", depth == 0 {
                    segments.append([])
                    index += 1
                    continue
                }
            }
            segments[segments.count - 1].append(token)
            index += 1
        }
        // A comment right after a comma, on the line where the previous column started, annotates
        // that column ("title TEXT, -- renamed from: name").
        for segmentIndex in segments.indices.dropFirst() {
            while let first = segments[segmentIndex].first, first.kind == .comment,
                  let previousStart = segments[segmentIndex - 1].first(where: { $0.kind != .comment }), previousStart.line == first.line {
                segments[segmentIndex - 1].append(first)
                segments[segmentIndex].removeFirst()
            }
        }
        // The table's annotation: a comment on the CREATE line before the first column.
        var tableRename: String?
        while let comment = segments[0].first, comment.kind == .comment, comment.line == createLine {
            tableRename = renamedFrom(in: comment.text) ?? tableRename
            segments[0].removeFirst()
        }
        for token in tokens[..<code[position].offset] where token.kind == .comment {
            tableRename = renamedFrom(in: token.text) ?? tableRename
        }
        var columns: [Column] = []
        var constraints: [String] = []
        for segment in segments {
            let body = segment.filter { $0.kind != .comment }
            guard let first = body.first else { continue }
            if first.kind == .word, Self.constraintKeywords.contains(first.identifier) {
                constraints.append(SQLTokenizer.normalized(body))
                continue
            }
            let annotation = segment.lazy.filter { $0.kind == .comment }.compactMap { renamedFrom(in: $0.text) }.first
            let definitionTokens = body.dropFirst()
            columns.append(Column(
                name: first.identifier, definition: SQLTokenizer.normalized(definitionTokens),
                sql: ([first.text] + definitionTokens.map(\.text)).joined(separator: " "), renamedFrom: annotation))
        }
        let options = closing < tokens.count ? SQLTokenizer.normalized(tokens[(closing + 1)...]) : ""
        return TableDefinition(name: nameToken.identifier, columns: columns, constraints: constraints, options: options,
                               renamedFrom: tableRename, sql: sql, nameRange: nameToken.range)
    }

    /// `old` from a comment `-- renamed from: old`.
    static func renamedFrom(in comment: String) -> String? {
        let text = comment.drop(while: { $0 == "-" || $0 == "/" || $0 == "*" || $0 == " " })
        guard text.lowercased().hasPrefix("renamed from:") else { return nil }
        let name = text.dropFirst("renamed from:".count).trimmingWhitespace()
            .trimmingCharacters(in: ["*", "/", "\"", "`", "[", "]"])
        return name.isEmpty ? nil : name.lowercased()
    }
}

/// `name` as a quoted SQL identifier.
func quote(_ name: String) -> String {
    "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
}

extension String {
    fileprivate func trimmingCharacters(in set: Set<Character>) -> String {
        var text = Substring(self)
        while let first = text.first, set.contains(first) { text = text.dropFirst() }
        while let last = text.last, set.contains(last) { text = text.dropLast() }
        return String(text)
    }
}
