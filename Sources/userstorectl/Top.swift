import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Top: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Watch the daemon live: calls per second by method with latencies, the busiest users, open stores, connections.",
            discussion: """
                On a terminal, refreshes every --interval seconds; q quits (like systemd-cgtop). \
                --once prints one report (--json: one JSON object, io.userstore.Admin.Top's reply). \
                Off a terminal, prints one report per interval until interrupted. Needs the \
                daemon's metrics (metrics.listen).
                """)

        @OptionGroup var connection: ConnectionOptions

        @Flag(help: "Print one report and exit.")
        var once = false

        @Option(help: "Busiest users shown.")
        var limit = 10

        @Option(help: "Seconds each report covers (1-9).")
        var seconds = 5

        @Option(help: "Seconds between refreshes.")
        var interval = 1.0

        func validate() throws {
            guard (1...9).contains(seconds) else { throw ValidationError("--seconds is 1 to 9") }
            guard interval >= 0.1 else { throw ValidationError("--interval is at least 0.1") }
        }

        func run() async throws {
            let client = try await connection.client()
            let report = { () async throws -> [String: JSONValue] in
                try await client.call(.top, ["limit": .integer(Int64(limit)), "seconds": .integer(Int64(seconds))])
            }
            if once {
                let result = try await report()
                return connection.json ? connection.output.jsonLine(.object(result)) : print(TopView.render(result, color: connection.output.color))
            }
            guard isatty(STDOUT_FILENO) == 1, isatty(STDIN_FILENO) == 1, !connection.json else {
                client.interruptOnSignal()
                while !Interrupt.requested {
                    let result = try await report()
                    if connection.json { connection.output.jsonLine(.object(result)) } else { print(TopView.render(result, color: false) + "\n") }
                    try? await Task.sleep(for: .seconds(interval))
                }
                return
            }
            let terminal = RawTerminal()
            defer { terminal.restore() }
            while true {
                let result = try await report()
                let screen = "\u{1B}[H\u{1B}[2J" + TopView.render(result, color: connection.output.color) + "\n(q quits)"
                FileHandle.standardOutput.write(Data(screen.utf8))
                let key = terminal.waitForKey(seconds: interval)
                if key == UInt8(ascii: "q") || key == 3 { break } // q or Ctrl-C
            }
            print()
        }
    }
}
