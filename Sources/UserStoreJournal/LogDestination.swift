import Foundation

/// Where log events go, following systemd's own rule for `auto`.
public enum LogDestination: Equatable, Sendable {
    /// Native journal protocol.
    case journal
    /// Lines on stderr; `priorityPrefix` when stderr is a journal stream.
    case stderr(priorityPrefix: Bool)

    /// The native journal socket (hard-coded in libsystemd too).
    public static let journalSocket = "/run/systemd/journal/socket"

    /// `auto`: the native journal when `$JOURNAL_STREAM` names our stderr (we were started by
    /// systemd with stderr to the journal) and the native socket exists; `<N>`-prefixed lines
    /// on stderr when it names stderr but the socket is missing; plain lines otherwise.
    public static func automatic(environment: [String: String] = ProcessInfo.processInfo.environment) -> LogDestination {
        guard let stream = environment["JOURNAL_STREAM"], stderrMatches(stream) else { return .stderr(priorityPrefix: false) }
        return FileManager.default.fileExists(atPath: journalSocket) ? .journal : .stderr(priorityPrefix: true)
    }

    /// Whether `JOURNAL_STREAM` ("device:inode") describes file descriptor 2.
    static func stderrMatches(_ stream: String) -> Bool {
        let parts = stream.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var info = stat()
        guard fstat(STDERR_FILENO, &info) == 0 else { return false }
        return UInt64(info.st_dev) == device && UInt64(info.st_ino) == inode
    }
}
