import Foundation
import Logging

/// Readable lines on stderr: `notice: store migrated ... [user=alice event=migration-finished]`.
/// When stderr is a journal stream (but the native socket is unusable), each line starts with
/// its syslog priority (`<5>`), which journald turns into the entry's PRIORITY.
public struct ConsoleLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    private let priorityPrefix: Bool
    private let timestamps: Bool

    /// `priorityPrefix`: stderr goes to journald. `timestamps`: prefix wall-clock time (not
    /// wanted when journald adds its own).
    public init(priorityPrefix: Bool, timestamps: Bool) {
        self.priorityPrefix = priorityPrefix
        self.timestamps = timestamps
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        var line = ""
        if priorityPrefix { line += "<\(JournalFields.priority(of: event.level))>" }
        if timestamps { line += Self.timestamp() + " " }
        line += "\(event.level): \(event.message)"
        if !merged.isEmpty {
            line += " [" + merged.sorted { $0.key < $1.key }.map { "\($0.key)=\(JournalFields.flatten($0.value))" }.joined(separator: " ") + "]"
        }
        // One write per line, so lines from different threads never interleave.
        if line.utf8.contains(UInt8(ascii: "\n")) { line = line.replacingOccurrences(of: "\n", with: "\\n") }
        let bytes = Array((line + "\n").utf8)
        bytes.withUnsafeBytes { _ = write(STDERR_FILENO, $0.baseAddress, $0.count) }
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var parts = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &parts)
        // By hand: String(format:) goes through Foundation's CFString formatter, a visible
        // share of a fleet migration's CPU when every step logs a line.
        var text = ""
        text.reserveCapacity(24)
        func digits(_ value: Int, _ width: Int) {
            let string = String(value)
            if string.count < width { text += String(repeating: "0", count: width - string.count) }
            text += string
        }
        digits(Int(parts.tm_year) + 1900, 4); text += "-"; digits(Int(parts.tm_mon) + 1, 2); text += "-"; digits(Int(parts.tm_mday), 2)
        text += "T"; digits(Int(parts.tm_hour), 2); text += ":"; digits(Int(parts.tm_min), 2); text += ":"; digits(Int(parts.tm_sec), 2)
        text += "."; digits(now.tv_nsec / 1_000_000, 3); text += "Z"
        return text
    }
}
