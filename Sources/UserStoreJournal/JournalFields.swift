import Logging

/// Builds the fields of one journal entry.
public enum JournalFields {
    /// `SYSLOG_IDENTIFIER` of every entry.
    public static let identifier = "userstored"
    /// Prefix of the daemon's own fields.
    public static let prefix = "USERSTORE_"

    /// A journal field name for metadata `key`: upper-cased, every character outside
    /// `[A-Z0-9_]` replaced by `_`, prefixed with `USERSTORE_`, at most 64 characters
    /// (journald's limit). `user` → `USERSTORE_USER`, `from-version` → `USERSTORE_FROM_VERSION`.
    public static func name(for key: String) -> String {
        var name = prefix
        for scalar in key.unicodeScalars {
            switch scalar {
            case "a"..."z": name.unicodeScalars.append(Unicode.Scalar(scalar.value - 32)!)
            case "A"..."Z", "0"..."9", "_": name.unicodeScalars.append(scalar)
            default: name.append("_")
            }
        }
        return String(name.prefix(64))
    }

    /// syslog priority of a swift-log level.
    public static func priority(of level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    /// The `KEY=value` fields of an entry, as raw bytes (values may hold newlines or any byte;
    /// `sd_journal_sendv` chooses the binary-safe encoding itself).
    public static func entry(level: Logger.Level, message: String, metadata: Logger.Metadata,
                             file: String, function: String, line: UInt) -> [[UInt8]] {
        var fields: [[UInt8]] = [
            field("MESSAGE", message),
            field("PRIORITY", String(priority(of: level))),
            field("SYSLOG_IDENTIFIER", identifier),
            field("CODE_FILE", file),
            field("CODE_LINE", String(line)),
            field("CODE_FUNC", function),
        ]
        if case .string(let event)? = metadata["event"], let kind = JournalEvent(rawValue: event) {
            fields.append(field("MESSAGE_ID", kind.messageID))
        }
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
            fields.append(field(name(for: key), flatten(value)))
        }
        return fields
    }

    static func field(_ name: String, _ value: String) -> [UInt8] {
        Array(name.utf8) + [UInt8(ascii: "=")] + Array(value.utf8)
    }

    static func flatten(_ value: Logger.MetadataValue) -> String {
        switch value {
        case .string(let text): return text
        case .stringConvertible(let convertible): return convertible.description
        case .array(let values): return values.map(flatten).joined(separator: ",")
        case .dictionary(let members): return members.sorted { $0.key < $1.key }.map { "\($0.key)=\(flatten($0.value))" }.joined(separator: ",")
        }
    }
}
