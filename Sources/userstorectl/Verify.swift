import ArgumentParser
import UserStoreCtl
import UserStoreCore
import Varlink

extension UserStoreCtlCommand {
    struct Verify: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check stores: integrity_check, foreign_key_check, checksums, bookkeeping against the schema.",
            discussion: "Exit code 1 when any store has a problem; each is listed with its problems.")

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var selection: FleetSelection
        @OptionGroup var offline: OfflineOptions

        func run() async throws {
            let command = FleetCommand(kind: .verify, output: connection.output)
            let code = offline.offline
                ? try await command.runOffline(configurationPath: offline.config, users: selection.users, all: selection.all, parallel: nil)
                : try command.runThroughDaemon(connection.client(), method: "io.userstore.Admin.Verify", parameters: [:],
                                               users: selection.users, all: selection.all)
            throw ExitCode(code.rawValue)
        }
    }
}
