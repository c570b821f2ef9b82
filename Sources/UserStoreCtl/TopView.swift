import Foundation
import Varlink

/// `userstorectl top`'s screen: a summary line and two tables, from a Top reply.
public enum TopView {
    public static func render(_ report: [String: JSONValue], color: Bool) -> String {
        func number(_ value: JSONValue?, _ digits: Int = 1) -> String {
            switch value {
            case .integer(let integer)?: return String(integer)
            case .real(let real)?: return String(format: "%.\(digits)f", real)
            default: return "-"
            }
        }
        func bold(_ text: String) -> String { color ? "\u{1B}[1m\(text)\u{1B}[0m" : text }
        func table(_ headers: [String], _ rows: [[String]]) -> [String] {
            var widths = headers.map(\.count)
            for row in rows { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) } }
            func line(_ cells: [String]) -> String {
                cells.enumerated().map { index, cell in
                    index == 0 ? cell.padding(toLength: widths[0], withPad: " ", startingAt: 0)
                        : String(repeating: " ", count: widths[index] - cell.count) + cell
                }.joined(separator: "  ")
            }
            return [bold(line(headers))] + rows.map(line)
        }
        var lines = ["userstored: \(number(report["perSecond"])) calls/s over the last \(number(report["seconds"])) s · "
                     + "\(number(report["openStores"])) open stores · \(number(report["connections"])) connections · "
                     + "\(number(report["migrationsInFlight"])) migrating · \(number(report["transactionsOpen"])) transactions open", ""]
        let methods = (report["methods"]?.arrayValue ?? []).map { method in
            [method["method"]?.stringValue ?? "", number(method["perSecond"]), number(method["p50Milliseconds"], 3),
             number(method["p99Milliseconds"], 3), number(method["secondsSpent"], 2)]
        }
        lines += table(["METHOD", "CALLS/S", "P50 MS", "P99 MS", "SECONDS"], methods)
        lines.append("")
        let users = (report["users"]?.arrayValue ?? []).map { user in
            [user["user"]?.stringValue ?? "", number(user["perSecond"]), number(user["secondsSpent"], 2), number(user["bytes"])]
        }
        lines += table(["USER", "CALLS/S", "SECONDS", "BYTES"], users)
        return lines.joined(separator: "\n")
    }
}

/// The terminal in non-canonical mode without echo or signals while `top` runs, so that one key
/// press is read (Ctrl-C arrives as a byte, and the terminal is always restored).
public final class RawTerminal {
    private var saved = termios()
    private let active: Bool

    public init() {
        active = tcgetattr(STDIN_FILENO, &saved) == 0
        guard active else { return }
        var raw = saved
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO | ISIG)
        tcsetattr(STDIN_FILENO, TCSANOW, &raw)
    }

    /// Waits up to `seconds` for a key; returns it, or nil.
    public func waitForKey(seconds: Double) -> UInt8? {
        var descriptor = pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, Int32(seconds * 1000)) > 0 else { return nil }
        var byte: UInt8 = 0
        return read(STDIN_FILENO, &byte, 1) == 1 ? byte : nil
    }

    public func restore() {
        if active { tcsetattr(STDIN_FILENO, TCSANOW, &saved) }
    }
}
