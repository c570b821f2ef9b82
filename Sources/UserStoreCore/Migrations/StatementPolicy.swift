/// Which statements of a migration file run, which are dropped, and which are refused.
enum StatementPolicy {
    enum Decision: Equatable {
        case run
        case ignore
        case refuse(String)
    }

    static func classify(_ statement: String) -> Decision {
        let words = SQLScript.keywords(of: statement, count: 4)
        guard let first = words.first else { return .ignore }
        switch first {
        case "BEGIN", "COMMIT", "END":
            return .ignore
        case "ROLLBACK":
            return words.count > 1 && words[1] == "TO"
                ? .run : .refuse("a ROLLBACK would abort the migration's own transaction")
        case "VACUUM":
            return .refuse("VACUUM cannot run inside a transaction")
        case "ATTACH", "DETACH":
            return .refuse("a migration may only change its own store")
        case "PRAGMA":
            let pragma = pragmaName(words)
            switch pragma {
            case "FOREIGN_KEYS", "DEFER_FOREIGN_KEYS": return .ignore
            case "USER_VERSION": return .refuse("user_version is the daemon's bookkeeping")
            case "JOURNAL_MODE", "SYNCHRONOUS", "LOCKING_MODE", "PAGE_SIZE", "AUTO_VACUUM", "WAL_CHECKPOINT":
                return .refuse("PRAGMA \(pragma.lowercased()) cannot change inside a transaction or is set by the daemon")
            default: return .run
            }
        default:
            return .run
        }
    }

    private static func pragmaName(_ words: [String]) -> String {
        guard words.count > 1 else { return "" }
        if (words[1] == "MAIN" || words[1] == "TEMP"), words.count > 2 { return words[2] }
        return words[1]
    }

    /// A short form of `statement` for error messages.
    static func summary(of statement: String) -> String {
        let words = SQLScript.keywords(of: statement, count: 3)
        return words.isEmpty ? statement.trimmingWhitespace() : words.joined(separator: " ")
    }
}
