import ArgumentParser
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Daemon and fleet state: versions, uptime, open, known, pending and failed stores; encrypted and plaintext stores; replication and the release in force.")

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var offline: OfflineOptions

        func run() async throws {
            let status: [String: JSONValue]
            if offline.offline {
                status = try await OfflineFleet(configurationPath: offline.config).status()
            } else {
                status = try await connection.client().call(.status)
            }
            let output = connection.output
            if output.json { return output.jsonLine(.object(status)) }
            func value(_ key: String) -> String { Output.cell(status[key]) }
            if offline.offline {
                print("offline   app \(value("appVersion"))   schema \(value("latestSchemaVersion")) (\(value("migrations")) migrations)")
                print("stores    \(value("knownStores")) known   \(value("currentStores")) current   \(value("pendingStores")) pending   \(value("tooNewStores")) too new   \(value("unreadableStores")) unreadable")
            } else {
                print("userstored \(value("daemonVersion"))   app \(value("appVersion"))   schema \(value("latestSchemaVersion")) (\(value("migrations")) migrations)   up \(Self.duration(status["uptimeSeconds"]?.integerValue ?? 0))")
                print("stores    \(value("knownStores")) known   \(value("currentStores")) current   \(value("pendingStores")) pending   "
                      + output.paint("\(value("failedStores")) failed", (status["failedStores"]?.integerValue ?? 0) > 0 ? .red : .green)
                      + "   \(value("tooNewStores")) too new\(status["indexComplete"] == false ? "   (still scanning)" : "")"
                      + (status["otherHostsStores"].map { "   (+\(Output.cell($0)) copies of other hosts' buckets)" } ?? ""))
                print("open      \(value("openStores"))/\(value("maxOpenStores"))   migrations in flight \(value("migrationsInFlight"))   connections \(value("connections"))")
                if status["encryptedStores"] != nil {
                    print("encrypted \(value("encryptedStores")) stores   \(value("plaintextStores")) plaintext (encrypted on their next open)")
                }
                if let replication = status["replication"] { print(Replication.summary(replication, output: output)) }
                if let release = status["release"] { print(Self.release(release, output: output)) }
            }
            print("data      \(value("dataDirectory"))")
        }

        /// The release line: its state in colour (as `release status` paints it), step, version
        /// and failures.
        static func release(_ release: JSONValue, output: Output) -> String {
            func value(_ key: String) -> String { Output.cell(release[key]) }
            return "release   \(value("id")) " + Release.paintState(release["state"], output: output)
                + "   step \(Release.percent(release["step"]))   version \(value("version"))"
                + "   \(value("failed")) failed (\(Release.ratio(release["failureRatio"])) of the step)   details: userstorectl release status"
        }

        static func duration(_ seconds: Int64) -> String {
            seconds >= 86_400 ? "\(seconds / 86_400)d \(seconds % 86_400 / 3600)h"
                : seconds >= 3600 ? "\(seconds / 3600)h \(seconds % 3600 / 60)m" : seconds >= 60 ? "\(seconds / 60)m \(seconds % 60)s" : "\(seconds)s"
        }
    }
}
