import Foundation
import Testing
import UserStoreReplication

/// Times as the log's objects and `RestoreFromReplica` carry them: microseconds both ways, so a
/// point in time taken between two commits falls between their objects.
@Suite struct RFC3339Tests {
    @Test func microsecondsSurviveARoundTripAndOrderIsKept() throws {
        let base = try #require(RFC3339.parse("2026-11-27T20:00:00Z"))
        #expect(RFC3339.format(base) == "2026-11-27T20:00:00.000000Z")
        for micros in [1, 999, 1_000, 123_456, 999_999] {
            let date = base.addingTimeInterval(Double(micros) / 1_000_000)
            let text = RFC3339.format(date)
            #expect(text == "2026-11-27T20:00:00." + String(format: "%06d", micros) + "Z")
            #expect(RFC3339.parse(text).map(RFC3339.format) == text)
        }
        // Two times 40 µs apart within one millisecond stay apart and in order.
        let earlier = base.addingTimeInterval(0.000_480), later = base.addingTimeInterval(0.000_520)
        let parsedEarlier = try #require(RFC3339.parse(RFC3339.format(earlier)))
        let parsedLater = try #require(RFC3339.parse(RFC3339.format(later)))
        #expect(parsedEarlier < parsedLater)
    }

    @Test func parsesWhatOthersWrite() throws {
        let base = try #require(RFC3339.parse("2026-11-27T20:00:00Z"))
        let cases: [(String, Double)] = [
            ("2026-11-27T20:00:00.5Z", 0.5),
            ("2026-11-27T20:00:00.123Z", 0.123),
            ("2026-11-27T20:00:00.123456789Z", 0.123457),  // Go's RFC3339Nano (Litestream)
            ("2026-11-27t20:00:00z", 0),
            ("2026-11-27T21:30:00+01:30", 0),
            ("2026-11-27T18:00:00-02:00", 0),
        ]
        for (text, offset) in cases {
            let date = try #require(RFC3339.parse(text), "\(text)")
            #expect(abs(date.timeIntervalSince(base) - offset) < 0.000_001, "\(text)")
        }
        let leapDay = try #require(RFC3339.parse("2024-02-29T00:00:00Z"))
        #expect(try #require(RFC3339.parse("2024-03-01T00:00:00Z")).timeIntervalSince(leapDay) == 86_400)
    }

    @Test func refusesWhatIsNotATime() {
        for text in ["", "2026-11-27", "2026-11-27T20:00:00", "2026-11-27 20:00:00Z", "2026-02-30T00:00:00Z",
                     "2026-13-01T00:00:00Z", "2026-11-27T24:00:00Z", "2026-11-27T20:00:00.Z", "2026-11-27T20:00:00Zjunk",
                     "2026-11-27T20:00:00+0100", "yesterday", "2026-11-27T20:00:00.12a3Z"] {
            #expect(RFC3339.parse(text) == nil, "\(text)")
        }
    }
}
