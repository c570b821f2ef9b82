import Foundation

/// RFC 3339 times as Litestream writes and reads them (`last_sync_at`, `restore -timestamp`)
/// and as `RestoreFromReplica` takes them: milliseconds when formatting (two writes within a
/// second are told apart), fractional seconds optional when parsing.
package enum RFC3339 {
    package static func format(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    package static func parse(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text)
    }
}
