import ArgumentParser
import Foundation
import UserStoreCtl

/// `userstorectl`: the admin CLI for a fleet of per-user stores.
@main
struct UserStoreCtlCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "userstorectl",
        abstract: "Inspect and migrate the stores of userstored.",
        discussion: """
            Talks to userstored over its socket (so it never races the daemon for a file); \
            status, verify and migrate also work --offline on the data directory while the \
            daemon is stopped.

            Exit codes: 0 all good; 1 some stores failed (or problems found); 2 usage; \
            3 daemon unreachable, permission denied, or (offline) the daemon holds the data \
            directory; 130 interrupted.
            """,
        version: "0.1.0",
        subcommands: [
            Status.self, List.self, Migrate.self, Plan.self, Verify.self, Rollback.self, Backup.self,
            Backups.self, Restore.self, Export.self, Import.self, Delete.self, Top.self,
            SQL.self, AcceptChecksums.self, Migrations.self, Replication.self, Cluster.self,
        ])

    /// Runs the CLI: usage errors exit 2 (not ArgumentParser's 64), as documented.
    static func main() async {
        do {
            var command = try parseAsRoot(hoistSharedOptions(Array(CommandLine.arguments.dropFirst())))
            if var asyncCommand = command as? AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch let error as CtlError {
            Output.error(error.message)
            Foundation.exit(error.exitCode.rawValue)
        } catch {
            let code = exitCode(for: error)
            let message = fullMessage(for: error)
            if code == .success {
                if !message.isEmpty { print(message) }
                Foundation.exit(0)
            }
            if !message.isEmpty { Output.error(message) }
            Foundation.exit(code == .validationFailure ? CtlExitCode.usage.rawValue : code.rawValue)
        }
    }
}

/// `userstorectl --socket S --json status` is accepted like `userstorectl status --socket S
/// --json`: shared options given before the subcommand are moved behind its name.
func hoistSharedOptions(_ arguments: [String]) -> [String] {
    var leading: [String] = []
    var rest = arguments[...]
    while let first = rest.first, first.hasPrefix("--") {
        if first == "--json" || first == "--offline" || first.hasPrefix("--socket=") || first.hasPrefix("--config=") {
            leading.append(first)
            rest = rest.dropFirst()
        } else if (first == "--socket" || first == "--config"), rest.count >= 2 {
            leading += [first, rest[rest.startIndex + 1]]
            rest = rest.dropFirst(2)
        } else {
            break
        }
    }
    guard !leading.isEmpty, let subcommand = rest.first else { return arguments }
    var result = [subcommand]
    // A nested subcommand ("migrations check") keeps its own name first.
    var tail = rest.dropFirst()
    if subcommand == "migrations", let nested = tail.first, !nested.hasPrefix("-") {
        result.append(nested)
        tail = tail.dropFirst()
    }
    return result + leading + tail
}

/// Options every command that talks to the daemon shares.
struct ConnectionOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The daemon's socket.", discussion: "Default: $USERSTORE_SOCKET, else /run/userstore/userstore.sock."))
    var socket: String?

    @Flag(help: "Print JSON for scripts (one object per line for streamed output; stable field names).")
    var json = false

    var socketPath: String {
        socket ?? ProcessInfo.processInfo.environment["USERSTORE_SOCKET"] ?? DaemonClient.defaultSocket
    }

    var output: Output { Output(json: json) }

    func client() throws(CtlError) -> DaemonClient {
        try DaemonClient(socketPath: socketPath)
    }
}

/// `--offline` and the configuration it needs.
struct OfflineOptions: ParsableArguments {
    @Flag(help: "Work on the data directory directly while userstored is stopped (takes the daemon's lock; refuses while it runs).")
    var offline = false

    @Option(help: "The daemon's configuration file, for --offline (data directory, migrations, app version).")
    var config = "/etc/userstore/userstored.yaml"
}

/// Users on the command line or --all.
struct FleetSelection: ParsableArguments {
    @Flag(help: "Every store.")
    var all = false

    @Argument(help: "User IDs.")
    var users: [String] = []

    func validate() throws {
        guard all != !users.isEmpty else { throw ValidationError("give either --all or one or more user IDs") }
    }
}
