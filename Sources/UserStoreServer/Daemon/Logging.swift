import UserStoreConfiguration
import Logging
import UserStoreJournal

/// Builds the daemon's logger for a log target.
enum LoggerFactory {
    /// The logger for `target`, and the journal writer behind it (to flush at exit), if any.
    static func makeLogger(target: DaemonConfiguration.LogTarget) -> (Logger, JournalWriter?) {
        let destination: LogDestination
        switch target {
        case .auto: destination = .automatic()
        case .journal: destination = .journal
        case .stderr: destination = .stderr(priorityPrefix: false)
        }
        var logger: Logger
        var journalWriter: JournalWriter?
        switch destination {
        case .journal:
            let writer = JournalWriter()
            journalWriter = writer
            logger = Logger(label: "userstored") { _ in JournalLogHandler(writer: writer) }
        case .stderr(let priorityPrefix):
            logger = Logger(label: "userstored") { _ in ConsoleLogHandler(priorityPrefix: priorityPrefix, timestamps: !priorityPrefix) }
        }
        logger.logLevel = .info
        return (logger, journalWriter)
    }
}
