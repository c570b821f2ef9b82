import Foundation

/// RFC 3339 times as the log's objects, leases and fences carry them, as Litestream writes and
/// reads them (`last_sync_at`, `restore -timestamp`) and as `RestoreFromReplica` takes them.
///
/// Formatting writes UTC with microseconds, rounded to the nearest one; parsing reads any number
/// of fractional digits (none, milliseconds, Go's nanoseconds) and any offset. Foundation's
/// `ISO8601DateFormatter` is not used: it keeps milliseconds only, rounding up when formatting
/// and truncating when parsing, so a commit made within a millisecond after the time a user
/// chose could land on either side of it and a point-in-time restore would bring it back.
package enum RFC3339 {
    /// `date` in UTC with six fractional digits: `2026-11-27T20:00:00.123456Z`.
    package static func format(_ date: Date) -> String {
        let micros = (date.timeIntervalSince1970 * 1_000_000).rounded()
        var seconds = time_t(floor(micros / 1_000_000))
        let fraction = Int(micros - Double(seconds) * 1_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func padded(_ value: Int32, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        let fractionDigits = String(fraction)
        return padded(parts.tm_year + 1900, 4) + "-" + padded(parts.tm_mon + 1, 2) + "-" + padded(parts.tm_mday, 2)
            + "T" + padded(parts.tm_hour, 2) + ":" + padded(parts.tm_min, 2) + ":" + padded(parts.tm_sec, 2)
            + "." + String(repeating: "0", count: 6 - fractionDigits.count) + fractionDigits + "Z"
    }

    /// The time `text` names (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, `T` and `Z` in either
    /// case), or nil when it is not one.
    package static func parse(_ text: String) -> Date? {
        var scanner = Scanner(Array(text.utf8))
        guard let year = scanner.digits(4), scanner.take("-"), let month = scanner.digits(2), scanner.take("-"),
              let day = scanner.digits(2), scanner.take("T") || scanner.take("t"),
              let hour = scanner.digits(2), scanner.take(":"), let minute = scanner.digits(2), scanner.take(":"),
              let second = scanner.digits(2),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second <= 60 else { return nil }
        var fraction = 0.0
        if scanner.take(".") {
            var scale = 0.1
            var any = false
            while let digit = scanner.digit() {
                fraction += Double(digit) * scale
                scale /= 10
                any = true
            }
            guard any else { return nil }
        }
        var offset = 0
        if scanner.take("Z") || scanner.take("z") {
        } else if let sign = scanner.take("+") ? 1 : scanner.take("-") ? -1 : nil,
                  let hours = scanner.digits(2), scanner.take(":"), let minutes = scanner.digits(2), hours < 24, minutes < 60 {
            offset = sign * (hours * 3600 + minutes * 60)
        } else {
            return nil
        }
        guard scanner.atEnd else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let seconds = timegm(&parts)
        // timegm normalises 31 February to 3 March: such a date is refused, not moved.
        guard parts.tm_mday == Int32(day) || second == 60 else { return nil }
        return Date(timeIntervalSince1970: Double(seconds - offset) + fraction)
    }

    /// Reads ASCII bytes left to right.
    private struct Scanner {
        let bytes: [UInt8]
        var index = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { index == bytes.count }

        mutating func take(_ character: Character) -> Bool {
            guard index < bytes.count, bytes[index] == character.asciiValue else { return false }
            index += 1
            return true
        }

        mutating func digit() -> Int? {
            guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else { return nil }
            defer { index += 1 }
            return Int(bytes[index] - UInt8(ascii: "0"))
        }

        mutating func digits(_ count: Int) -> Int? {
            var value = 0
            for _ in 0..<count {
                guard let digit = digit() else { return nil }
                value = value * 10 + digit
            }
            return value
        }
    }
}
