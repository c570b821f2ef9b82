import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Cluster: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Work with a cluster of hosts (cluster.* in the daemon's configuration).",
            discussion: "See docs/cluster.md. Planned moves and drain are not built yet.",
            subcommands: [Status.self])

        struct Status: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Show the cluster as this host's daemon sees it: hosts, buckets per host, epochs.",
                discussion: """
                    One line for this host (whether it may acknowledge writes, and how long its lease lasts \
                    without renewal) and the controller; then every host: its address, whether its lease \
                    lives, how many of the 4096 buckets it owns and the newest epoch among them. A host that \
                    is not live still owning buckets means the controller has yet to move them. Exit 1 when \
                    this host may not acknowledge writes or buckets are unassigned. io.userstore.Admin.ClusterOff \
                    when the daemon runs on one host.
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() throws {
                let result = try connection.client().call("io.userstore.Admin.Cluster", [:])
                let output = connection.output
                if output.json {
                    output.jsonLine(.object(result))
                } else {
                    let may = result["mayAcknowledge"]?.boolValue == true
                    print("host \(Output.cell(result["host"]))   " + output.paint(may ? "acknowledging" : "not acknowledging", may ? .green : .red)
                          + "   lease \(Output.cell(result["leaseRemainingSeconds"])) s   controller \(result["controller"].map { Output.cell($0) } ?? "-")"
                          + "   unassigned buckets \(Output.cell(result["unassignedBuckets"]))")
                    output.table(["HOST", "ADDRESS", "LIVE", "BUCKETS", "NEWEST EPOCH"], (result["hosts"]?.arrayValue ?? []).map { host in
                        [Output.cell(host["name"]), Output.cell(host["address"]), host["live"]?.boolValue == true ? "yes" : "no",
                         Output.cell(host["buckets"]), Output.cell(host["newestEpoch"])]
                    })
                }
                if result["mayAcknowledge"]?.boolValue != true || result["unassignedBuckets"]?.integerValue != 0 { throw ExitCode(1) }
            }
        }
    }
}
