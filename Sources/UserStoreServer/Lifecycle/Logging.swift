import UserStoreConfiguration
import Logging
import UserStoreJournal

/// Builds the daemon's logger for a log target.
enum LoggerFactory {
    /// The journal writer, when logging to the journal (flushed at exit).
    nonisolated(unsafe) static var journalWriter: JournalWriter? // set once, before any other thread logs

    static func makeLogger(target: DaemonConfiguration.LogTarget) -> Logger {
        let destination: LogDestination
        switch target {
        case .auto: destination = .automatic()
        case .journal: destination = .journal
        case .stderr: destination = .stderr(priorityPrefix: false)
        }
        var logger: Logger
        switch destination {
        case .journal:
            let writer = JournalWriter()
            journalWriter = writer
            logger = Logger(label: "userstored") { _ in JournalLogHandler(writer: writer) }
        case .stderr(let priorityPrefix):
            logger = Logger(label: "userstored") { _ in ConsoleLogHandler(priorityPrefix: priorityPrefix, timestamps: !priorityPrefix) }
        }
        logger.logLevel = .info
        return logger
    }
}
