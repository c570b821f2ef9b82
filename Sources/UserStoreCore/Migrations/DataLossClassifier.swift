/// Which migration statements can lose or change data a store already holds: the rule behind
/// `migrations.backupBeforeMigrating: auto` (a store is copied first only when one of its
/// pending migrations can) and the notes of `userstorectl migrations check`.
///
/// The rule is deliberately a short list of statements known to only add (see docs/migrations.md);
/// anything else — including statements this classifier does not recognise — counts as able to
/// lose data, so a mistake here costs a copy, never a store.
public enum DataLossClassifier {
    /// What one statement does to existing data.
    public enum Effect: Sendable, Equatable {
        /// Adds schema or changes none: `CREATE TABLE/INDEX/VIEW/TRIGGER`, `ALTER TABLE … ADD`
        /// or `RENAME`, `DROP INDEX/VIEW/TRIGGER`, `SELECT`, `ANALYZE`, savepoints.
        case additive
        /// A plain `INSERT`: adds rows, unless a trigger or an `ON CONFLICT REPLACE` clause
        /// already in the store turns it into a delete (checked on the store itself).
        case insertsRows
        /// Can delete or rewrite existing data (or is not understood), with why.
        case canLoseData(String)
    }

    /// What `statement` can do to existing data.
    public static func effect(of statement: String) -> Effect {
        let words = SQLScript.keywords(of: statement, count: 6)
        guard let first = words.first else { return .additive }
        func word(_ index: Int) -> String { index < words.count ? words[index] : "" }
        let summary = SQLScript.excerpt(of: statement)
        switch first {
        case "CREATE":
            // CREATE [TEMP|TEMPORARY] [UNIQUE] TABLE|INDEX|VIEW|TRIGGER|VIRTUAL TABLE
            let kinds: Set<String> = ["TABLE", "INDEX", "VIEW", "TRIGGER", "VIRTUAL"]
            let kind = ["TEMP", "TEMPORARY", "UNIQUE"].contains(word(1)) ? word(2) : word(1)
            return kinds.contains(kind) ? .additive : .canLoseData("'\(summary)' is not a statement known to only add")
        case "ALTER":
            // ALTER TABLE name ADD|RENAME|DROP …
            switch word(3) {
            case "ADD", "RENAME": return .additive
            case "DROP": return .canLoseData("'\(summary)' drops a column and its data")
            default: return .canLoseData("'\(summary)' is not a statement known to only add")
            }
        case "DROP":
            switch word(1) {
            case "INDEX", "VIEW", "TRIGGER": return .additive // derived objects: no row is lost
            case "TABLE": return .canLoseData("'\(summary)' drops (or rebuilds) a table")
            default: return .canLoseData("'\(summary)' is not a statement known to only add")
            }
        case "INSERT":
            if word(1) == "OR" {
                return word(2) == "IGNORE" || word(2) == "ABORT" || word(2) == "FAIL" || word(2) == "ROLLBACK"
                    ? .insertsRows : .canLoseData("'\(summary)' replaces existing rows")
            }
            // An upsert (ON CONFLICT … DO UPDATE) rewrites rows; the text is searched as a whole,
            // so a string that merely contains the words also counts (a copy too many, not too few).
            return statement.uppercased().contains("CONFLICT") ? .canLoseData("'\(summary)' may update existing rows (ON CONFLICT)") : .insertsRows
        case "REPLACE": return .canLoseData("'\(summary)' replaces existing rows")
        case "UPDATE": return .canLoseData("'\(summary)' updates existing rows")
        case "DELETE": return .canLoseData("'\(summary)' deletes rows")
        case "SELECT", "ANALYZE", "SAVEPOINT", "RELEASE": return .additive
        case "ROLLBACK": return .additive // ROLLBACK TO a savepoint (a bare ROLLBACK is refused at load)
        default: return .canLoseData("'\(summary)' is not a statement known to only add")
        }
    }

    /// The first statement of a migration's Up section that can lose data, with why
    /// (`"0006_title_limit.sql: 'DROP TABLE notes' drops (or rebuilds) a table"`); nil when all
    /// of them only add. `insertsRows` says whether it has a plain INSERT (safe only on a store
    /// without triggers or REPLACE conflict clauses).
    public static func risk(of up: [String], fileName: String) -> (reason: String?, insertsRows: Bool) {
        var inserts = false
        for statement in up {
            switch effect(of: statement) {
            case .additive: continue
            case .insertsRows: inserts = true
            case .canLoseData(let why): return (fileName + ": " + why, inserts)
            }
        }
        return (nil, inserts)
    }
}
