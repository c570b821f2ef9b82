import ArgumentParser
import UserStoreCore
import UserStoreCtl
import UserStoreInterface
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
            // An if, not a ternary with `try await` in one branch: Swift 6.3.1 crashes compiling
            // that in release mode (coroutine splitting).
            if offline.offline {
                let code = try await command.runOffline(configurationPath: offline.config, users: selection.users, all: selection.all, parallel: nil)
                throw ExitCode(code.rawValue)
            }
            let code = try await command.runThroughDaemon(connection.client(), method: Method.verify.rawValue, parameters: [:],
                                                    users: selection.users, all: selection.all)
            throw ExitCode(code.rawValue)
        }
    }
}
