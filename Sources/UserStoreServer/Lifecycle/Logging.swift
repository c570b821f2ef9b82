import Logging

/// Builds the daemon's logger for a log target.
enum LoggerFactory {
    static func makeLogger(target: DaemonConfiguration.LogTarget) -> Logger {
        var logger = Logger(label: "userstored") { label in StreamLogHandler.standardError(label: label) }
        logger.logLevel = .info
        return logger
    }
}
