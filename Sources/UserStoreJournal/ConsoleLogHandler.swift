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
        let bytes = Array((line.replacingOccurrences(of: "\n", with: "\\n") + "\n").utf8)
        bytes.withUnsafeBytes { _ = write(STDERR_FILENO, $0.baseAddress, $0.count) }
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var parts = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &parts)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.tm_year + 1900, parts.tm_mon + 1, parts.tm_mday,
                      parts.tm_hour, parts.tm_min, parts.tm_sec, now.tv_nsec / 1_000_000)
    }
}
