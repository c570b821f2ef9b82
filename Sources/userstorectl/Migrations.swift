import ArgumentParser
import UserStoreCtl
import Varlink

extension UserStoreCtlCommand {
    struct Migrations: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Work with migration files.", subcommands: [Check.self])

        struct Check: ParsableCommand, DaemonlessCommand {
            static let configuration = CommandConfiguration(
                abstract: "Lint a migrations directory offline.",
                discussion: """
                    Reports duplicate, malformed or mis-sorted versions, a missing Up, statements that cannot \
                    run in a transaction, unterminated statements, destructive statements (DROP TABLE, DROP \
                    COLUMN; a table rebuilt under its own name is not one), and compiles every statement \
                    against a scratch database built from the earlier migrations. Exit code 1 when it finds \
                    an error or a warning.
                    """)

            @Argument(help: "The directory (default: /etc/userstore/migrations).")
            var directory = "/etc/userstore/migrations"

            @Flag(help: "Do not report destructive statements.")
            var allowDestructive = false

            @Flag(help: "Print JSON: one finding per line.")
            var json = false

            func run() throws {
                let findings = MigrationLinter(allowDestructive: allowDestructive).check(directory: directory)
                let output = Output(json: json)
                for finding in findings {
                    if json {
                        output.jsonLine(["file": .string(finding.file), "severity": .string(finding.severity.rawValue), "message": .string(finding.message)])
                    } else {
                        let style: Output.Style = finding.severity == .error ? .red : finding.severity == .warning ? .yellow : .bold
                        print("\(finding.file): \(output.paint(finding.severity.rawValue, style)): \(finding.message)")
                    }
                }
                let problems = findings.filter { $0.severity != .note }.count
                if !json { print(problems == 0 ? "\(directory): ok" : "\(directory): \(problems) problem\(problems == 1 ? "" : "s")") }
                if problems > 0 { throw ExitCode(CtlExitCode.someFailed.rawValue) }
            }
        }
    }
}
