import ArgumentParser
import Foundation
import UserStoreCore
import UserStoreCtl
import UserStoreInterface
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
            let code: CtlExitCode
            if offline.offline {
                code = try await command.runOffline(configurationPath: offline.config, users: selection.users, all: selection.all,
                                                    parallel: parallel, dryRun: dryRun)
            } else {
                var parameters: [String: JSONValue] = ["dryRun": .bool(dryRun)]
                if let parallel { parameters["parallel"] = .integer(Int64(parallel)) }
                code = try await command.runThroughDaemon(connection.client(), method: Method.migrate.rawValue, parameters: parameters,
                                                    users: selection.users, all: selection.all)
            }
            throw ExitCode(code.rawValue)
        }
    }
}
