import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Replication: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show replication (Litestream): its state, and per open store whether it is registered and its lag.",
            discussion: """
                Without USER: every open store (only open stores are registered with Litestream; a closed store's \
                replica is complete as of its close). With USER: that store, open or not, and its replica URL. \
                Lag is the time since Litestream last synced the store. Exit 1 when replication is degraded. \
                See docs/replication.md.
                """)

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "A user ID (default: every open store).")
        var user: String?

        func run() throws {
            var parameters: [String: JSONValue] = [:]
            if let user { parameters["user"] = .string(user) }
            let result = try connection.client().call("io.userstore.Admin.Replication", parameters)
            let output = connection.output
            let status = result["replication"] ?? .null
            if output.json {
                output.jsonLine(.object(result))
            } else {
                print(Self.summary(status, output: output))
                output.table(["USER", "OPEN", "REGISTERED", "LAST SYNC", "LAG", "REPLICA"], (result["stores"]?.arrayValue ?? []).map { store in
                    [Output.cell(store["user"]), store["open"]?.boolValue == true ? "yes" : "no",
                     store["registered"]?.boolValue == true ? "yes" : "no", store["lastSyncAt"].map { Output.cell($0) } ?? "-",
                     store["lagSeconds"].map { Output.cell($0) + " s" } ?? "-", Output.cell(store["replica"])]
                })
            }
            if status["state"]?.stringValue != "ok" { throw ExitCode(1) }
        }

        /// One line for `status` and the head of `replication`.
        static func summary(_ status: JSONValue, output: Output) -> String {
            func value(_ key: String) -> String { Output.cell(status[key]) }
            let state = value("state")
            var line = "replication " + output.paint(state, state == "ok" ? .green : .red)
                + "   \(value("registeredStores")) registered   \(value("unregisteredStores")) unregistered   max lag \(value("maxLagSeconds")) s"
                + "   \(value("restoredStores")) restored   durable writes \(status["durableWrites"]?.boolValue == true ? "on" : "off")   litestream \(value("litestreamVersion")) pid \(value("litestreamPid"))"
                + "\n            replica \(value("replica"))   last sync pass \(value("syncPassSeconds")) s (longest \(value("longestSyncPassSeconds")) s)"
                + "   syncs \(value("syncs")) (\(value("sharedSyncWaits")) waits shared)"
                + (status["replicaIndexUsers"]?.integerValue.map { "   bucket index \($0) users" } ?? "")
            if let diverged = status["divergedReplicas"]?.integerValue, diverged > 0 {
                line += "\n            " + output.paint("\(diverged) replicas found diverged after a fault (shipped whole again; see replica-diverged in the journal)", .yellow)
            }
            if let problem = status["replicaProblem"]?.stringValue { line += "\n            " + output.paint("replica: \(problem)", .red) }
            if let error = status["lastError"]?.stringValue { line += "\n            last error: \(error)" }
            return line
        }
    }
}
