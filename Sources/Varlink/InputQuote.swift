/// How an error reply quotes an input it refuses: whole when short, otherwise its first 64
/// bytes and its length (`aaaaaaaa... (10000 bytes)`), so that a hostile 10 MB user ID or method
/// name is not sent back whole (nor logged whole).
public enum InputQuote {
    /// The most bytes of an input an error quotes.
    public static let limit = 64

    /// `text` whole if it has at most ``limit`` bytes; else its first ``limit`` bytes (cut at a
    /// character boundary), an ellipsis and the length in bytes.
    public static func prefix(_ text: String) -> String {
        let length = text.utf8.count
        guard length > limit else { return text }
        // Whole scalars while they fit: reads at most `limit` bytes of a hostile 10 MB input.
        var bytes = 0
        let kept = text.unicodeScalars.prefix { scalar in
            bytes += UTF8.width(scalar)
            return bytes <= limit
        }
        return String(String.UnicodeScalarView(kept)) + "... (\(length) bytes)"
    }
}
