import UserStoreCore
/// What the fuzzers check on migration files and SQL text (`Fuzz/`, scripts/fuzz.sh); the tests
/// replay the seed corpora through the same functions. Each traps on a broken invariant.
package enum CoreFuzzing {
    /// A migration file: any text either parses or is refused with a problem, never a crash;
    /// what parses has Up statements (or is empty) that SQLite's own tokenizer could split.
    package static func migrationFile(_ data: UnsafeBufferPointer<UInt8>) {
        let text = String(decoding: data, as: UTF8.self)
        guard let migration = try? MigrationFileParser.parse(version: 1, name: "fuzz", fileName: "0001_fuzz.sql", contents: text) else { return }
        for statement in migration.up { precondition(!statement.isEmpty, "an empty Up statement") }
        _ = migration.checksum
    }

    /// SQL text: tokens come back in order, inside the text, each the text at its range; the
    /// statement splitter never crashes.
    package static func sql(_ data: UnsafeBufferPointer<UInt8>) {
        let text = String(decoding: data, as: UTF8.self)
        let characters = Array(text)
        var last = 0
        for token in SQLTokenizer.tokens(text) {
            precondition(token.range.lowerBound >= last && token.range.upperBound <= characters.count, "token out of order or out of the text")
            precondition(String(characters[token.range]) == token.text, "a token is not the text at its range")
            last = token.range.upperBound
        }
        let script = SQLScript(text)
        for statement in script.statements { _ = SQLScript.firstKeyword(of: statement) }
    }
}
