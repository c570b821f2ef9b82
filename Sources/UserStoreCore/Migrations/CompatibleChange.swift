/// The `-- Compatible` marker: a migration that an older daemon, which does not know it, may
/// serve a store past (mixed versions during a rolling deploy, docs/releases.md). Only
/// additive changes qualify — an older app version's reads and writes work unchanged on them:
/// new tables, new columns (nullable or with a default: SQLite demands one of the two when
/// adding a column), new indexes.
enum CompatibleChange {
    /// Whether `line` is the marker (`-- Compatible`, any case; also `-- userstore:compatible`).
    static func isMarker(_ line: Substring) -> Bool {
        let text = line.trimmingWhitespace()
        guard text.hasPrefix("--") else { return false }
        let rest = text.dropFirst(2).trimmingWhitespace().lowercased()
        return rest == "compatible" || rest == "userstore:compatible"
    }

    /// Why `statement` is not additive (a short reason), or nil when it is.
    static func problem(with statement: String) -> String? {
        let tokens = SQLTokenizer.tokens(statement).filter { $0.kind != .comment }
        func word(_ index: Int) -> String? {
            guard index < tokens.count, tokens[index].kind == .word else { return nil }
            return tokens[index].text.uppercased()
        }
        switch (word(0), word(1)) {
        case ("CREATE", "TABLE"), ("CREATE", "INDEX"):
            return nil
        case ("CREATE", "UNIQUE") where word(2) == "INDEX":
            return nil
        case ("ALTER", "TABLE"):
            // ALTER TABLE [schema.]name ADD ...
            var index = 3
            if index < tokens.count, tokens[index].text == "." { index += 2 }
            return word(index) == "ADD" ? nil : "only ALTER TABLE ... ADD COLUMN keeps older readers working"
        default:
            return "only CREATE TABLE, CREATE INDEX and ALTER TABLE ... ADD COLUMN keep older readers working"
        }
    }
}
