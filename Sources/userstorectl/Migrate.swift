import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreCore
import Varlink

extension UserStoreCtlCommand {
    struct Migrate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Migrate stores now, ahead of traffic.",
            discussion: """
                Every store given (or every store, with --all) is brought to the latest schema through \
                the daemon. A progress bar shows on a terminal; failures are listed at the end with \
                their reason, and the exit code is 1 if any store failed. Ctrl-C stops starting new \
                stores (stores in flight finish or roll back); running the command again does only \
                what is left.
                """)

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var selection: FleetSelection
        @OptionGroup var offline: OfflineOptions

        @Flag(help: "Show what would be migrated; change nothing.")
        var dryRun = false

        @Option(help: "How many stores to migrate at once (default: the daemon's fleetParallelism).")
        var parallel: Int?

        func validate() throws {
            if let parallel, !(1...256).contains(parallel) { throw ValidationError("--parallel must be between 1 and 256") }
        }

        func run() async throws {
            let command = FleetCommand(kind: .migrate, output: connection.output)
            if offline.offline {
                let fleet = try await OfflineFleet(configurationPath: offline.config)
                let users = try selection.all ? fleet.users() : selection.users.map { try UserID($0) }
                let tally = command.tally(total: users.count)
                installInterruptHandler()
                let dryRun = self.dryRun
                await fleet.forEach(users, parallel: parallel ?? fleet.configuration.fleetParallelism, { registry, user in
                    await OfflineFleet.migrate(registry, user, dryRun: dryRun)
                }, report: tally.record)
                throw ExitCode(tally.finish(interrupted: Interrupt.requested).rawValue)
            }
            var parameters: [String: JSONValue] = ["dryRun": .bool(dryRun)]
            if selection.all { parameters["all"] = true } else { parameters["users"] = .array(selection.users.map { .string($0) }) }
            if let parallel { parameters["parallel"] = .integer(Int64(parallel)) }
            let client = try connection.client()
            client.interruptOnSignal()
            let tally = command.tally(total: selection.all ? 0 : selection.users.count)
            var interrupted = false
            do {
                try client.stream("io.userstore.Admin.Migrate", parameters) { reply in
                    if reply["summary"] == nil, reply["user"] != nil { tally.record(reply) }
                }
            } catch {
                guard Interrupt.requested || error.exitCode == .interrupted else { throw error }
                interrupted = true
            }
            throw ExitCode(tally.finish(interrupted: interrupted).rawValue)
        }
    }
}

/// Ctrl-C in offline mode: stop starting stores, let the ones in flight finish.
func installInterruptHandler() {
    Interrupt.watch(-1)
}
