import ArgumentParser
import Foundation
import UserStoreCore
import UserStoreCtl
import UserStoreInterface
import Varlink

extension UserStoreCtlCommand {
    struct Release: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Roll a release (the migrations a reload loaded) out in stages: canary, steps, automatic halt.",
            discussion: """
                A reload that loads new migration versions starts a release. Without a rollout policy \
                (rollout.* in the daemon's configuration, or `release start`) every store migrates on its \
                next request, as always. With one, only the stores of the current step's cohort migrate \
                (lazily, or with `migrate --all`); every other store is served at the version it has. A \
                user's cohort: the first 8 bytes of SHA-256 of the ID, big-endian, modulo 10,000, below \
                the step's percentage times 100; the same on every host and in every run. The release \
                halts by itself once the stores that failed to migrate pass --halt-on of the stores the \
                step reaches. See docs/releases.md.
                """,
            subcommands: [Status.self, Start.self, Next.self, Resume.self, Abort.self, Trial.self],
            defaultSubcommand: Status.self)

        struct Status: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Show the release in force: its state, step, stores per version, failures, rate and time left.",
                discussion: """
                    --json prints one object (io.userstore.Admin.Release's reply): state (none, running, halted, \
                    complete, aborted), step (percent), versions (schema version -> stores), failed (users), \
                    failures (with errors), failureRatio, and more. Exit 1 when the release is halted.
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let status = try await connection.client().call(.release, [:])
                let output = connection.output
                if output.json {
                    output.jsonLine(.object(status))
                } else {
                    print(Self.render(status, output: output))
                }
                if status["state"]?.stringValue == "halted" { throw ExitCode(1) }
            }

            static func render(_ status: [String: JSONValue], output: Output) -> String {
                func text(_ key: String) -> String { Output.cell(status[key]) }
                let percent = Release.percent, ratio = { (key: String) in Release.ratio(status[key]) }
                let versions = (status["versions"]?.objectValue ?? [:]).sorted { (Int64($0.key) ?? 0) < (Int64($1.key) ?? 0) }
                let perVersion = "Stores per schema version: " + (versions.isEmpty ? "none known." : versions.map { "v\($0.key): \(Output.cell($0.value))" }.joined(separator: ", ") + ".")
                // No release: said in the words `release start` refuses with, and nothing of a rollout.
                guard status["state"]?.stringValue != "none" else {
                    return [UserStoreCore.Release.noReleaseText + " (schema version \(text("version"))).", perVersion].joined(separator: "\n")
                }
                var lines = ["Release \(text("id")) is " + Release.paintState(status["state"], output: output)
                             + ": schema version \(text("baseVersion")) to \(text("version"))."]
                if status["staged"]?.boolValue == true {
                    let steps = (status["steps"]?.arrayValue ?? []).map { percent($0) }.joined(separator: ", ")
                    let canary = (status["canary"]?.arrayValue ?? []).compactMap(\.stringValue)
                    lines.append("Step \(percent(status["step"])) of \(steps)" + (canary.isEmpty ? "" : ", canary users \(canary.joined(separator: ", "))")
                                 + "; \(text("waitSeconds")) s per step; it halts past \(ratio("haltOn")) failed.")
                } else {
                    lines.append("Not staged: every store migrates on its next request.")
                }
                let known = Int(status["knownStores"]?.integerValue ?? 0), atVersion = Int(status["storesAtVersion"]?.integerValue ?? 0)
                lines.append("\(atVersion) of \(known) stores are at version \(text("version")); the current step reaches \(text("storesReached")).   "
                             + "[" + ProgressBar.bar(fraction: known == 0 ? 1 : Double(atVersion) / Double(known), width: 30) + "]")
                lines.append(perVersion)
                var timing = ["Migrating \(text("ratePerSecond")) stores/s"]
                if let left = status["secondsLeft"]?.integerValue { timing.append("about \(left) s left in this step") }
                if let next = status["nextStepAt"]?.stringValue { timing.append("next step at \(next)") }
                if let last = status["secondsToLastStep"]?.integerValue { timing.append("last step in \(last) s") }
                lines.append(timing.joined(separator: "; ") + ".")
                if let reason = status["haltReason"]?.stringValue { lines.append(output.paint("halted: \(reason)", .red)) }
                let failures = status["failures"]?.arrayValue ?? []
                if !failures.isEmpty {
                    lines.append(output.paint("\(failures.count) store\(failures.count == 1 ? "" : "s") failed (\(ratio("failureRatio")) of the stores reached):", .red))
                    for failure in failures.prefix(20) { lines.append("  \(Output.cell(failure["user"])): \(Output.cell(failure["error"]))") }
                    if failures.count > 20 { lines.append("  ... and \(failures.count - 20) more (--json lists them all)") }
                }
                return lines.joined(separator: "\n")
            }
        }

        struct Start: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Stage the release in force: canary users first, then the steps, halting by itself.",
                discussion: """
                    Replaces the release's rollout policy (the configuration's rollout.* or an earlier start) and \
                    begins again at its first step: the canary users alone (a step of 0%) when --canary is given, \
                    then each of --steps, each lasting --wait. Stores already migrated stay migrated. Also starts \
                    a halted or aborted release again; refused when the release is complete or there is none.
                    """)

            @OptionGroup var connection: ConnectionOptions

            @Option(help: "Users in the release from its first step, comma-separated.")
            var canary: String?

            @Option(help: "The steps in percent of users, ascending, the last 100% (e.g. 1%,10%,50%,100%).")
            var steps: String

            @Option(help: "How long each step lasts before the next (90s, 10m, 2h; default 10m).")
            var wait: String = "10m"

            @Option(name: .customLong("halt-on"), help: "Halt once this share of the stores a step reaches failed to migrate (default 1%).")
            var haltOn: String = "1%"

            func run() async throws {
                let stepValues: [Double]
                do { stepValues = try RolloutPolicy.parseSteps(steps) } catch { throw ValidationError(error.description) }
                guard let seconds = RolloutPolicy.parseDuration(wait) else { throw ValidationError("--wait: \"\(wait)\" is not a duration like 90s, 10m or 2h") }
                guard let halt = RolloutPolicy.parsePercent(haltOn) else { throw ValidationError("--halt-on: \"\(haltOn)\" is not a percentage like 1%") }
                let users = canary.map(commaSeparated) ?? []
                let policy: RolloutPolicy
                do {
                    policy = try RolloutPolicy(steps: stepValues, canary: users, waitSeconds: seconds, haltOn: halt / 100)
                } catch {
                    throw ValidationError(error.description)
                }
                let result = try await connection.client().call(.startRelease, [
                    "steps": .array(policy.steps.map { .real($0) }), "canary": .array(policy.canary.map { .string($0) }),
                    "waitSeconds": .integer(Int64(policy.waitSeconds)), "haltOn": .real(policy.haltOn),
                ])
                Release.printBrief(result, verb: "started", output: connection.output)
            }
        }

        struct Next: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Move a running staged release to its next step now, without waiting.")

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                Release.printBrief(try await connection.client().call(.advanceRelease, [:]), verb: "at", output: connection.output)
            }
        }

        struct Resume: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Run a halted release again (after fixing what failed).",
                discussion: """
                    Its failures are forgotten: the stores whose migration failed are tried again on their next \
                    request (or now with `migrate --all`), and the step's wait starts again. Fix the migration \
                    file first and reload; where stores already applied the old file, accept its new checksum \
                    (`accept-checksums`).
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                Release.printBrief(try await connection.client().call(.resumeRelease, [:]), verb: "resumed", output: connection.output)
            }
        }

        struct Abort: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Roll the release back: every store returns to, and stays at, the version before it.",
                discussion: """
                    Refused, with nothing changed, when one of the release's migrations has no -- Down section \
                    (the error lists them). Otherwise no store migrates to the release's versions from now on, \
                    lazily or with migrate --all, until a new release starts (a reload with other versions, or \
                    `release start`), and every store that has them is rolled back. Exit 1 if some store could \
                    not be rolled back (listed).
                    """)

            @OptionGroup var connection: ConnectionOptions

            func run() async throws {
                let result = try await connection.client().call(.abortRelease, [:])
                let failed = result["failed"]?.arrayValue ?? []
                if connection.output.json {
                    connection.output.jsonLine(.object(result))
                } else {
                    print("release \(Output.cell(result["id"])) aborted: \(Output.cell(result["rolledBack"])) stores rolled back")
                    for store in failed { print("  \(Output.cell(store["user"])): \(Output.cell(store["error"]))") }
                }
                if !failed.isEmpty { throw ExitCode(1) }
            }
        }

        struct Trial: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Run the loaded migrations on copies of stores: what the release will do to real data.",
                discussion: """
                    Copies each store (consistently, in the data directory's staging folder) and runs the \
                    pending migrations on the copy: per store whether it succeeded, the error, the run's \
                    duration and the copy's size before and after; then a summary with the predicted failure \
                    ratio. Without USER, a random sample of --sample stores (default 100) among those behind \
                    the latest version. Nothing live changes: a store is held only while it is copied, and \
                    copies take no open-store slot. --json prints one line per store ({"user", "ok", "error", \
                    "milliseconds", "bytesBefore", "bytesAfter", ...}) and a final {"summary": true, ...} line. \
                    Exit 1 when a migration failed on some copy.
                    """)

            @OptionGroup var connection: ConnectionOptions

            @Option(help: "How many stores to sample (default 100).")
            var sample: Int?

            @Option(help: "Copies at once (default 4).")
            var parallel: Int?

            @Argument(help: "Users whose stores to try (default: a sample).")
            var users: [String] = []

            func validate() throws {
                if sample != nil && !users.isEmpty { throw ValidationError("give USER... or --sample, not both") }
                if let sample, sample < 1 { throw ValidationError("--sample must be at least 1") }
                if let parallel, !(1...64).contains(parallel) { throw ValidationError("--parallel must be between 1 and 64") }
            }

            func run() async throws {
                var parameters: [String: JSONValue] = [:]
                if !users.isEmpty { parameters["users"] = .array(users.map { .string($0) }) }
                if let sample { parameters["sample"] = .integer(Int64(sample)) }
                if let parallel { parameters["parallel"] = .integer(Int64(parallel)) }
                let output = connection.output
                var summary: [String: JSONValue] = [:]
                var bar = ProgressBar()
                var done = 0, failures = 0
                let total = users.isEmpty ? (sample ?? 100) : users.count
                try await connection.client().stream(.trialRelease, parameters) { reply in
                    if reply["summary"] == .bool(true) { summary = reply }
                    if output.json { return output.jsonLine(.object(reply)) }
                    guard reply["user"] != nil else { return }
                    done += 1
                    if reply["ok"] != .bool(true) {
                        failures += 1
                        if output.interactive { FileHandle.standardOutput.write(Data("\r\u{1B}[K".utf8)) }
                        print(output.paint("\(Output.cell(reply["user"])): failed: \(Output.cell(reply["error"]))", .red))
                    }
                    if output.interactive { bar.draw(done: done, total: max(done, total), failures: failures) }
                }
                if !output.json {
                    if output.interactive && done > 0 { bar.finish() }
                    var ratio = Output.cell(summary["predictedFailureRatio"])
                    if case .real(let value)? = summary["predictedFailureRatio"] { ratio = RolloutPolicy.percent(ratio: value) }
                    print("trial on \(Output.cell(summary["stores"])) stores: \(Output.cell(summary["succeeded"])) ok, \(Output.cell(summary["failed"])) failed"
                          + " (predicted failure ratio \(ratio)); migration p50 \(Output.cell(summary["millisecondsP50"])) ms,"
                          + " p99 \(Output.cell(summary["millisecondsP99"])) ms, max \(Output.cell(summary["millisecondsMax"])) ms;"
                          + " size \(Output.cell(summary["bytesBefore"])) -> \(Output.cell(summary["bytesAfter"])) bytes")
                }
                if (summary["failed"]?.integerValue ?? 0) > 0 { throw ExitCode(1) }
            }
        }

        static func printBrief(_ result: [String: JSONValue], verb: String, output: Output) {
            if output.json { return output.jsonLine(.object(result)) }
            print("release \(Output.cell(result["id"])) \(verb): \(Output.cell(result["state"])), step \(percent(result["step"]))")
        }

        /// A release's step (or any percentage the daemon sends as a number) as shown: "10%".
        static func percent(_ value: JSONValue?) -> String {
            if case .real(let number)? = value { return RolloutPolicy.format(number) + "%" }
            return Output.cell(value) + "%"
        }

        /// A ratio from 0 to 1 (`failureRatio`, `haltOn`) as a percentage: "3.1%".
        static func ratio(_ value: JSONValue?) -> String {
            if case .real(let number)? = value { return RolloutPolicy.percent(ratio: number) }
            return Output.cell(value)
        }

        /// A release's state in colour: halted or aborted red, complete green, running yellow.
        static func paintState(_ state: JSONValue?, output: Output) -> String {
            let text = Output.cell(state)
            return output.paint(text, text == "halted" || text == "aborted" ? .red : text == "complete" ? .green : .yellow)
        }
    }
}
