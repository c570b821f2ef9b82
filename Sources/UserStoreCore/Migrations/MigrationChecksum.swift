import Crypto
import Foundation

/// The checksum recorded for each applied migration.
///
/// Computed over the Up section and the directives after normalising the text: a byte-order
/// mark is dropped, CRLF and CR become LF, trailing spaces and tabs at the end of each line and
/// blank lines at the end are removed. So a file that went through a Windows checkout or an
/// editor that trims whitespace keeps its checksum; any change to what runs changes it.
/// Editing the Down section does not: it never ran.
public enum MigrationChecksum {
    /// Hex SHA-256 of the normalised `upSection` and `directives`.
    public static func of(upSection: String, directives: [String]) -> String {
        var text = normalise(upSection)
        for directive in directives { text += "\n-- directive: " + normalise(directive) }
        return SHA256.hash(data: Array(text.utf8)).map { byte in
            let digits = Array("0123456789abcdef")
            return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
        }.joined()
    }

    /// `text` without a byte-order mark and with every CRLF or CR turned into LF.
    public static func unifyLineEndings(_ text: String) -> String {
        var body = text
        if body.unicodeScalars.first == "\u{FEFF}" { body.unicodeScalars.removeFirst() }
        return body.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
    }

    /// The normalised form of `text` described above.
    public static func normalise(_ text: String) -> String {
        var lines = unifyLineEndings(text).split(separator: "\n", omittingEmptySubsequences: false).map { line -> Substring in
            var trimmed = line
            while let last = trimmed.last, last == " " || last == "\t" { trimmed = trimmed.dropLast() }
            return trimmed
        }
        while let last = lines.last, last.isEmpty { lines.removeLast() }
        while let first = lines.first, first.isEmpty { lines.removeFirst() }
        return lines.joined(separator: "\n")
    }
}

