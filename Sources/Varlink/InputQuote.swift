/// How an error reply quotes an input it refuses: whole when short, otherwise its first 64
/// bytes and its length (`aaaaaaaa... (10000 bytes)`), so that a hostile 10 MB user ID or method
/// name is not sent back whole (nor logged whole).
public enum InputQuote {
    /// The most bytes of an input an error quotes.
    public static let limit = 64

    /// `text` whole if it has at most ``limit`` bytes; else its first ``limit`` bytes (cut at a
    /// character boundary), an ellipsis and the length in bytes.
    public static func prefix(_ text: String) -> String {
        let utf8 = text.utf8
        guard utf8.count > limit else { return text }
        var end = utf8.index(utf8.startIndex, offsetBy: limit)
        while end > utf8.startIndex && !text.unicodeScalars.indices.contains(end) { end = utf8.index(before: end) }
        return String(text[..<end]) + "... (\(utf8.count) bytes)"
    }
}
