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
            if offline.offline {
                let fleet = try await OfflineFleet(configurationPath: offline.config)
                let users = try selection.all ? fleet.users() : selection.users.map { try UserID($0) }
                let tally = command.tally(total: users.count)
                installInterruptHandler()
                await fleet.forEach(users, parallel: fleet.configuration.fleetParallelism, { registry, user in
                    await OfflineFleet.verify(registry, user)
                }, report: tally.record)
                throw ExitCode(tally.finish(interrupted: Interrupt.requested).rawValue)
            }
            var parameters: [String: JSONValue] = [:]
            if selection.all { parameters["all"] = true } else { parameters["users"] = .array(selection.users.map { .string($0) }) }
            let client = try connection.client()
            client.interruptOnSignal()
            let tally = command.tally(total: selection.all ? 0 : selection.users.count)
            var interrupted = false
            do {
                try client.stream("io.userstore.Admin.Verify", parameters) { reply in
                    if reply["user"] != nil { tally.record(reply) }
                }
            } catch {
                guard Interrupt.requested || error.exitCode == .interrupted else { throw error }
                interrupted = true
            }
            throw ExitCode(tally.finish(interrupted: interrupted).rawValue)
        }
    }
}
