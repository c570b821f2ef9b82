import Foundation
import UserStoreCore
import Varlink

/// How results are printed: aligned tables for people, one JSON object per line for scripts.
public struct Output: Sendable {
    /// `--json`.
    public var json: Bool
    /// Colour only when stdout is a terminal (and NO_COLOR is unset).
    public var color: Bool
    /// stdout is a terminal (progress bars are drawn only then).
    public var interactive: Bool

    public init(json: Bool) {
        self.json = json
        interactive = isatty(STDOUT_FILENO) == 1
        color = interactive && !json && ProcessInfo.processInfo.environment["NO_COLOR"] == nil
    }

    /// Prints `value` as one line of JSON.
    public func jsonLine(_ value: JSONValue) {
        print(value.serialized)
    }

    /// Prints rows under headers, each column as wide as its widest cell.
    public func table(_ headers: [String], _ rows: [[String]]) {
        var widths = headers.map(\.count)
        for row in rows { for (index, cell) in row.enumerated() where index < widths.count { widths[index] = max(widths[index], cell.count) } }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                index == cells.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }
        print(paint(line(headers), .bold))
        for row in rows { print(line(row)) }
    }

    public enum Style: String { case bold = "1", red = "31", green = "32", yellow = "33" }

    /// `text` in `style` when colour is on.
    public func paint(_ text: String, _ style: Style) -> String {
        color ? "\u{1B}[\(style.rawValue)m\(text)\u{1B}[0m" : text
    }

    /// One line on stderr.
    public static func error(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }

    /// A JSON value as a table cell.
    public static func cell(_ value: JSONValue?) -> String {
        switch value {
        case nil, .null?: return "NULL"
        case .string(let text)?: return text.replacingOccurrences(of: "\n", with: "\\n")
        case .object(let members)? where members.count == 1 && members["blob"] != nil:
            let bytes = Data(base64Encoded: members["blob"]?.stringValue ?? "") ?? Data()
            return "x'" + bytes.map { String(format: "%02x", $0) }.joined() + "'"
        case let value?: return value.serialized
        }
    }
}

/// A one-line live progress bar, redrawn in place with `\r`.
public struct ProgressBar {
    public var width = 30
    private var lastDraw = ContinuousClock.now - .seconds(1)
    private let started = ContinuousClock.now

    public init() {}

    /// The line for `done` of `total` with `failures`.
    public func line(done: Int, total: Int, failures: Int) -> String {
        let fraction = total == 0 ? 1 : Double(done) / Double(total)
        let bar = Self.bar(fraction: fraction, width: width)
        let elapsed = ContinuousClock.now - started
        let seconds = elapsed.inSeconds
        let rate = seconds > 0 ? Double(done) / seconds : 0
        let eta = rate > 0 ? Int(Double(total - done) / rate) : 0
        return "[\(bar)] \(done)/\(total) \(Int(fraction * 100))%  \(Int(rate))/s  ETA \(eta)s  \(failures) failed"
    }

    /// Redraws at most ten times a second (and always for the last step).
    public mutating func draw(done: Int, total: Int, failures: Int) {
        guard ContinuousClock.now - lastDraw >= .milliseconds(100) || done == total else { return }
        lastDraw = .now
        FileHandle.standardOutput.write(Data(("\r" + line(done: done, total: total, failures: failures) + "\u{1B}[K").utf8))
    }

    /// `=====>     ` for `fraction` (0–1) of `width` characters.
    public static func bar(fraction: Double, width: Int) -> String {
        let filled = Int(fraction * Double(width))
        return String(repeating: "=", count: filled) + (filled < width ? ">" : "") + String(repeating: " ", count: max(0, width - filled - 1))
    }

    /// Ends the bar's line.
    public func finish() {
        FileHandle.standardOutput.write(Data("\n".utf8))
    }
}
