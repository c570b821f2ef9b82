import ArgumentParser
import Foundation
import UserStoreCtl
import UserStoreCore

/// `userstorectl`: the admin CLI for a fleet of per-user stores.
@main
struct UserStoreCtlCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "userstorectl",
        abstract: "Inspect and migrate the stores of userstored.",
        discussion: """
            Talks to userstored over its socket (so it never races the daemon for a file); \
            status, verify and migrate also work --offline on the data directory while the \
            daemon is stopped, and restore --from-replica --offline --to PATH writes a user's \
            store from the replica with no daemon at all.

            The shared options --socket, --json, --offline and --config may come before the \
            subcommand's name as well as after it: `userstorectl --socket PATH cluster status`.

            Exit codes: 0 all good; 1 some stores failed (or problems found); 2 usage; \
            3 daemon unreachable, permission denied, or (offline) the daemon holds the data \
            directory; 130 interrupted.
            """,
        version: UserStoreVersion.current,
        subcommands: [
            Status.self, List.self, Migrate.self, Plan.self, Verify.self, Rollback.self, Backup.self,
            Backups.self, Restore.self, Export.self, Import.self, Delete.self, Top.self,
            SQL.self, AcceptChecksums.self, Migrations.self, Release.self, Query.self, Replication.self, Cluster.self, Watch.self, Keys.self, Encrypt.self,
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

/// `userstorectl --socket S --json cluster status` is accepted like `userstorectl cluster status
/// --socket S --json`: shared options given before the subcommand are moved behind its whole name
/// (nested ones included, found in the command tree). `--socket` before a command that does not
/// talk to the daemon (``DaemonlessCommand``) is accepted and has nothing to do.
func hoistSharedOptions(_ arguments: [String], root: any ParsableCommand.Type = UserStoreCtlCommand.self) -> [String] {
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
    guard !leading.isEmpty, !rest.isEmpty else { return arguments }
    var path: [String] = []
    var command = root
    while let name = rest.first, let sub = command.configuration.subcommands.first(where: { $0._commandName == name }) {
        path.append(name)
        command = sub
        rest = rest.dropFirst()
    }
    if command is any DaemonlessCommand.Type {
        var kept: [String] = []
        var index = leading.startIndex
        while index < leading.endIndex {
            if leading[index] == "--socket" { index += 2; continue }
            if !leading[index].hasPrefix("--socket=") { kept.append(leading[index]) }
            index += 1
        }
        leading = kept
    }
    return path + leading + rest
}

/// A command that never talks to the daemon (`migrations check`): a `--socket` given before it
/// is accepted and ignored, like before any other command.
protocol DaemonlessCommand {}

/// The items of a comma-separated option (`--users a,b`, `--tables t,u`), each trimmed.
func commaSeparated(_ text: String) -> [String] {
    text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
}

/// Options every command that talks to the daemon shares.
struct ConnectionOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The daemon's socket.", discussion: """
        Default: $USERSTORE_SOCKET; else a checkout's development daemon (.run/userstore.sock, \
        looked for from the current directory and from this binary's folder upwards: what \
        scripts/run.sh serves); else /run/userstore/userstore.sock.
        """))
    var socket: String?

    @Flag(help: "Print JSON for scripts (one object per line for streamed output; stable field names).")
    var json = false

    /// The socket given (`--socket`, `$USERSTORE_SOCKET`), or nil: look for one.
    var givenSocket: String? {
        socket ?? ProcessInfo.processInfo.environment["USERSTORE_SOCKET"]
    }

    var output: Output { Output(json: json) }

    func client() async throws(CtlError) -> DaemonClient {
        if let givenSocket { return try await DaemonClient.connect(socketPath: givenSocket) }
        let candidates = SocketDiscovery.candidates()
        // Only the installed daemon's socket: say where a checkout's was looked for too.
        return try await DaemonClient.connect(trying: candidates, searched: candidates.count == 1 ? SocketDiscovery.searched() : nil)
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
