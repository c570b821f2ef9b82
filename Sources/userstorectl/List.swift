import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List stores with their schema version and state (streamed; fine for 100,000 stores).")

        enum State: String, ExpressibleByArgument, CaseIterable {
            case current, pending, failed
            case tooNew = "too-new"
        }

        @OptionGroup var connection: ConnectionOptions

        @Option(help: "Only stores in this state: current, pending, failed or too-new.")
        var state: State?

        @Option(help: "At most this many stores.")
        var limit: Int?

        func run() async throws {
            var parameters: [String: JSONValue] = [:]
            if let state { parameters["state"] = .string(state.rawValue.replacingOccurrences(of: "-", with: "_")) }
            if let limit { parameters["limit"] = .integer(Int64(limit)) }
            let output = connection.output
            let client = try await connection.client()
            client.interruptOnSignal()
            // Rows are printed as they arrive, in fixed-width columns, so nothing is held in memory.
            if !output.json { print(output.paint(Self.row("USER", "VERSION", "STATE", "ERROR"), .bold)) }
            try await client.stream(.listStores, parameters) { reply in
                guard let store = reply["store"] else { return }
                if output.json { return output.jsonLine(store) }
                print(Self.row(Output.cell(store["user"]), Output.cell(store["schemaVersion"]),
                               Output.cell(store["state"]).replacingOccurrences(of: "_", with: "-"), store["error"].map { Output.cell($0) } ?? ""))
            }
        }

        static func row(_ user: String, _ version: String, _ state: String, _ error: String) -> String {
            func pad(_ text: String, _ width: Int) -> String { text.count >= width ? text + " " : text.padding(toLength: width, withPad: " ", startingAt: 0) }
            return pad(user, 32) + " " + pad(version, 8) + pad(state, 9) + error
        }
    }
}
