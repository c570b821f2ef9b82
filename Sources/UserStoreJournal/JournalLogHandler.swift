import Logging

/// A swift-log handler that writes natively to journald (`sd_journal_sendv`): `MESSAGE`,
/// `PRIORITY`, `SYSLOG_IDENTIFIER=userstored`, `CODE_FILE`/`CODE_LINE`/`CODE_FUNC`, a
/// `MESSAGE_ID` from the `event` metadata, and every metadata key as a `USERSTORE_` field.
/// Logging only queues the entry (see ``JournalWriter``): it never blocks for long and never
/// crashes the caller.
public struct JournalLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    private let writer: JournalWriter

    public init(writer: JournalWriter) {
        self.writer = writer
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        guard writer.reserve() else { return }
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        writer.enqueue(JournalFields.entry(level: event.level, message: event.message.description, metadata: merged,
                                           file: event.file, function: event.function, line: event.line))
    }
}
