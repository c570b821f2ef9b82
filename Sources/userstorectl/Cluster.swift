import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Cluster: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Work with a cluster of hosts (cluster.* in the daemon's configuration).",
            discussion: "See docs/cluster.md.",
            subcommands: [Status.self, Move.self, Drain.self, Rebalance.self])

        struct Move: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Move a bucket (0-4095) to a host.",
                discussion: """
                    The controller marks the bucket draining (its users get Retry), its owner syncs and closes \
                    their stores, then HOST owns it at a new epoch and restores them on first request. Returns \
                    at once; `cluster status` shows moving buckets and requested moves until it is done. A \
                    user's bucket: the first 8 bytes of SHA-256 of the ID, big-endian, modulo 4096.
                    """)

            @OptionGroup var connection: ConnectionOptions
            @Argument(help: "The bucket, 0-4095.") var bucket: Int
            @Argument(help: "The host to move it to (a live host's cluster.host).") var host: String

            func run() async throws {
                let result = try await connection.client().call(.moveBucket, ["bucket": .integer(Int64(bucket)), "host": .string(host)])
                if connection.output.json { connection.output.jsonLine(.object(result)) } else {
                    print("moving bucket \(bucket) from \(Output.cell(result["from"])) to \(Output.cell(result["to"]))")
                }
            }
        }

        struct Drain: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Move every bucket off a host and give it none, for maintenance.",
                discussion: """
                    Each of HOST's buckets moves to another host (rendezvous hashing), as with `cluster move`. \
                    The mark is bound to HOST's lease: it ends when HOST leaves or restarts. `cluster status` \
                    shows HOST as draining and its bucket count falling to 0.
                    """)

            @OptionGroup var connection: ConnectionOptions
            @Argument(help: "The host to drain.") var host: String

            func run() async throws {
                let result = try await connection.client().call(.drainHost, ["host": .string(host)])
                if connection.output.json { connection.output.jsonLine(.object(result)) } else {
                    print("draining \(host): \(Output.cell(result["buckets"])) buckets to move")
                }
            }
        }

        struct Rebalance: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Give every live host its share of the buckets (after hosts joined).",
                discussion: """
                    A host that joins takes no buckets by itself. This asks the controller to move each bucket \
                    whose owner is not its rendezvous owner among the live hosts not being drained, each as with \
                    `cluster move`; nothing else moves. Returns at once with the number of moves asked; \
                    `cluster status` shows them until they are done.
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let result = try await connection.client().call(.rebalance, [:])
                if connection.output.json { connection.output.jsonLine(.object(result)) } else {
                    print("rebalancing: \(Output.cell(result["moves"])) buckets to move")
                }
            }
        }

        struct Status: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Show the cluster as this host's daemon sees it: hosts, buckets per host, epochs.",
                discussion: """
                    One line for this host (whether it may acknowledge writes, and how long its lease lasts \
                    without renewal), the controller, unassigned and moving buckets and unfinished move \
                    requests; then every host: its address, whether its lease lives, whether it is being \
                    drained, how many of the 4096 buckets it owns and the newest epoch among them. A host that \
                    is not live still owning buckets means the controller has yet to move them. Exit 1 when \
                    this host may not acknowledge writes or buckets are unassigned. io.userstore.Admin.ClusterOff \
                    when the daemon runs on one host.
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let result = try await connection.client().call(.cluster, [:])
                let output = connection.output
                if output.json {
                    output.jsonLine(.object(result))
                } else {
                    let may = result["mayAcknowledge"]?.boolValue == true
                    print("host \(Output.cell(result["host"]))   " + output.paint(may ? "acknowledging" : "not acknowledging", may ? .green : .red)
                          + "   lease \(Output.cell(result["leaseRemainingSeconds"])) s   controller \(result["controller"].map { Output.cell($0) } ?? "-")"
                          + "   unassigned buckets \(Output.cell(result["unassignedBuckets"]))"
                          + "   moving \(Output.cell(result["movingBuckets"]))   requested moves \(Output.cell(result["requestedMoves"]))")
                    output.table(["HOST", "ADDRESS", "LIVE", "DRAINING", "BUCKETS", "NEWEST EPOCH"], (result["hosts"]?.arrayValue ?? []).map { host in
                        [Output.cell(host["name"]), Output.cell(host["address"]), host["live"]?.boolValue == true ? "yes" : "no",
                         host["draining"]?.boolValue == true ? "yes" : "no", Output.cell(host["buckets"]), Output.cell(host["newestEpoch"])]
                    })
                }
                if result["mayAcknowledge"]?.boolValue != true || result["unassignedBuckets"]?.integerValue != 0 { throw ExitCode(1) }
            }
        }
    }
}
