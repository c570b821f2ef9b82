import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Replication: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show replication (the host log), or act on the replica: init, take-over.",
            discussion: """
                `replication [USER]` shows replication's state (`show`, the default; `replication show init` \
                shows a user named init). `replication init` says that the replica configured is this data \
                directory's and new; `replication take-over` takes the replica's writer lease from a host \
                that is gone. See docs/replication.md.
                """,
            subcommands: [Show.self, Init.self, TakeOver.self],
            defaultSubcommand: Show.self)

        struct Show: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Show replication: its state, the host log, the replica's identity and writer lease, and the open stores.",
                discussion: """
                    Without USER: every open store (registered: its base is in the log). With USER: that store, open or \
                    not, and where its copy is. The host log line: objects written and not yet folded, the oldest commit \
                    not yet stored and the bytes waiting. The replica line says whether the \
                    replica is this data directory's (verified; missing or mismatch: nothing is created or \
                    restored) and, with one host, who holds its writer lease (holding: this host; standby: \
                    another, and this host serves no store). Exit 1 when replication is degraded.
                    """)

            @OptionGroup var connection: ConnectionOptions

            @Argument(help: "A user ID (default: every open store).")
            var user: String?

            func run() async throws {
                var parameters: [String: JSONValue] = [:]
                if let user { parameters["user"] = .string(user) }
                let result = try await connection.client().call(.replication, parameters)
                let output = connection.output
                let status = result["replication"] ?? .null
                if output.json {
                    output.jsonLine(.object(result))
                } else {
                    print(Replication.summary(status, output: output))
                    output.table(["USER", "OPEN", "REGISTERED", "LAST SYNC", "LAG", "REPLICA"], (result["stores"]?.arrayValue ?? []).map { store in
                        [Output.cell(store["user"]), store["open"]?.boolValue == true ? "yes" : "no",
                         store["registered"]?.boolValue == true ? "yes" : "no", store["lastSyncAt"].map { Output.cell($0) } ?? "-",
                         store["lagSeconds"].map { Output.cell($0) + " s" } ?? "-", Output.cell(store["replica"])]
                    })
                }
                if status["state"]?.stringValue != "ok" { throw ExitCode(1) }
            }
        }

        struct Init: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Say that the replica configured is this data directory's, new: write its marker and bind the data directory to it.",
                discussion: """
                    The daemon starts a new replica by itself only when an empty data directory meets an empty \
                    replica. A data directory that holds stores (or names a replica) meeting an empty replica is \
                    what an unmounted folder or an emptied prefix looks like: replication stays unavailable and \
                    no user is created or restored. Run this when the replica really is meant to be new — \
                    replication turned on for a data directory that already has stores, or moved to a new bucket \
                    or folder. It refuses a replica that already carries another replica's marker. Open stores \
                    are then compared with, or shipped whole to, the new replica; closed ones when next opened. \
                    See docs/replication.md, "The replica's identity".
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let result = try await connection.client().call(.initReplica, [:])
                let output = connection.output
                if output.json { return output.jsonLine(.object(result)) }
                print("replica \(Output.cell(result["replicaId"])) is this data directory's (marker written by \(Output.cell(result["createdBy"])) at \(Output.cell(result["createdAt"])))")
            }
        }

        struct TakeOver: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                commandName: "take-over",
                abstract: "Take the replica's writer lease at once, under a new epoch (one host).",
                discussion: """
                    A host that does not hold the lease serves no store; it takes the lease by itself once the \
                    holder gives it up (a clean stop) or once it has seen the lease unrenewed for \
                    replication.leaseSeconds. Run this on the new host when you know the old one is gone and do \
                    not want to wait. If the old host comes back, it finds the lease taken: it serves and \
                    acknowledges nothing, and what it still uploads goes under its old epoch, which no restore \
                    reads once the new host wrote the user. See docs/replication.md, "One writer".
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let result = try await connection.client().call(.takeOverReplica, [:])
                let output = connection.output
                if output.json { return output.jsonLine(.object(result)) }
                let previous = result["previousHolder"].map { " (was \(Output.cell($0)), epoch \(Output.cell(result["previousEpoch"])))" } ?? ""
                print("\(Output.cell(result["holder"])) holds the replica's writer lease at epoch \(Output.cell(result["epoch"]))\(previous)")
            }
        }

        /// One line for `status` and the head of `replication`.
        static func summary(_ status: JSONValue, output: Output) -> String {
            func value(_ key: String) -> String { Output.cell(status[key]) }
            let state = value("state")
            var line = "replication " + output.paint(state, state == "ok" ? .green : .red)
                + "   \(value("registeredStores")) registered   \(value("unregisteredStores")) unregistered"
                + "   \(value("restoredStores")) restored   durable writes \(status["durableWrites"]?.boolValue == true ? "on" : "off")"
                + "\n            replica \(value("replica"))"
                + (status["replicaIndexUsers"]?.integerValue.map { "   bucket index \($0) users" } ?? "")
            if let log = status["log"] {
                line += "\n            host log: \(Output.cell(log["objectsWritten"])) objects written, \(Output.cell(log["tailObjects"])) unfolded"
                    + " (folded after \(Output.cell(log["foldSeconds"])) s; \(Output.cell(log["objectsFolded"])) folded)"
                    + "   oldest unstored commit \(Output.cell(log["oldestUnstoredSeconds"])) s   \(Output.cell(log["pendingBytes"])) bytes waiting"
                if let error = log["foldError"]?.stringValue { line += "\n            " + output.paint("fold failing: \(error)", .red) }
            }
            let identity = status["identity"]?.stringValue ?? "none"
            if identity != "none" {
                line += "\n            replica id \(status["replicaId"]?.stringValue ?? "-") " + output.paint(identity, identity == "verified" ? .green : .red)
                if let lease = status["lease"] {
                    let state = lease["state"]?.stringValue ?? "unknown"
                    line += "   writer lease " + output.paint(state, state == "holding" ? .green : state == "standby" ? .yellow : .red)
                    if let holder = lease["holder"]?.stringValue {
                        line += " (\(holder), epoch \(Output.cell(lease["epoch"])), renewed \(Output.cell(lease["renewedAt"])))"
                    }
                }
            }
            if let problem = status["replicaProblem"]?.stringValue { line += "\n            " + output.paint("replica: \(problem)", .red) }
            if let problem = status["lease"]?["problem"]?.stringValue { line += "\n            " + output.paint("writer lease: \(problem)", .red) }
            if let error = status["lastError"]?.stringValue { line += "\n            last error: \(error)" }
            return line
        }
    }
}
