import Foundation
import UserStoreCore
import UserStoreProtocol
import Varlink

/// The shared shape of `migrate` and `verify`: stream per-store outcomes (from the daemon or
/// offline), draw progress on a terminal, print JSON lines for scripts, list failures at the
/// end, exit 1 when any store failed and 130 when interrupted.
public struct FleetCommand {
    public enum Kind: Sendable { case migrate, verify }

    public let kind: Kind
    public let output: Output

    public init(kind: Kind, output: Output) {
        self.kind = kind
        self.output = output
    }

    /// Tracks outcomes and prints them.
    public final class Tally {
        let command: FleetCommand
        var done = 0
        var total: Int
        var failures: [(String, String)] = []
        var counts: [String: Int] = [:]
        var bar = ProgressBar()
        let started = ContinuousClock.now
        let drawsBar: Bool

        init(command: FleetCommand, total: Int) {
            self.command = command
            self.total = total
            drawsBar = command.output.interactive && !command.output.json
        }

        /// Records one store's outcome (a Migrate/Verify reply or its offline equivalent).
        public func record(_ fields: [String: JSONValue]) {
            guard let user = fields["user"]?.stringValue else { return }
            done += 1
            if let reportedTotal = fields["total"]?.integerValue { total = Int(reportedTotal) }
            let failed: Bool
            switch command.kind {
            case .migrate:
                let state = fields["state"]?.stringValue ?? "?"
                counts[state, default: 0] += 1
                failed = state == "failed"
                if failed { failures.append((user, fields["error"]?.stringValue ?? "failed")) }
            case .verify:
                failed = fields["ok"] != .bool(true)
                counts[failed ? "problems" : "ok", default: 0] += 1
                if failed {
                    let problems = fields["problems"]?.arrayValue?.compactMap(\.stringValue) ?? []
                    failures.append((user, problems.joined(separator: "; ")))
                }
            }
            if command.output.json {
                var line = fields
                for key in ["done", "total", "failures", "migrated"] { line[key] = nil }
                command.output.jsonLine(.object(line))
            } else if drawsBar {
                bar.draw(done: done, total: total, failures: failures.count)
            } else if failed || command.kind == .migrate && fields["state"] != "current" && fields["state"] != "held" {
                print("\(user): \(describe(fields))")
            }
        }

        private func describe(_ fields: [String: JSONValue]) -> String {
            switch command.kind {
            case .migrate:
                let state = fields["state"]?.stringValue ?? "?"
                if state == "failed" { return "failed: \(fields["error"]?.stringValue ?? "")" }
                return "\(state) \(fields["fromVersion"]?.integerValue ?? 0) -> \(fields["toVersion"]?.integerValue ?? 0)"
            case .verify:
                return (fields["problems"]?.arrayValue?.compactMap(\.stringValue) ?? []).joined(separator: "; ")
            }
        }

        /// Prints the summary; returns the exit code.
        public func finish(interrupted: Bool) -> CtlExitCode {
            if drawsBar && done > 0 { bar.finish() }
            let elapsed = ContinuousClock.now - started
            let seconds = elapsed.inSeconds
            if command.output.json {
                command.output.jsonLine(.object([
                    "summary": true, "done": .integer(Int64(done)), "total": .integer(Int64(total)),
                    "failures": .integer(Int64(failures.count)), "interrupted": .bool(interrupted),
                    "counts": .object(counts.mapValues { .integer(Int64($0)) }), "seconds": .real((seconds * 1000).rounded() / 1000),
                ]))
            } else {
                let parts = counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
                print("\(done)/\(total) stores in \(String(format: "%.1f", seconds)) s: \(parts.isEmpty ? "nothing to do" : parts)")
                if !failures.isEmpty {
                    print(command.output.paint("\(failures.count) store\(failures.count == 1 ? "" : "s") \(command.kind == .migrate ? "failed" : "have problems"):", .red))
                    for (user, reason) in failures { print("  \(user): \(reason)") }
                }
                if let held = counts["held"], held > 0 {
                    print("\(held) store\(held == 1 ? " was" : "s were") held back on purpose: the release does not reach \(held == 1 ? "it" : "them") yet (userstorectl release status)")
                }
                if interrupted { Output.error("interrupted: stores already started finished or rolled back; run the command again to do the rest") }
            }
            if interrupted { return .interrupted }
            return failures.isEmpty ? .success : .someFailed
        }
    }

    public func tally(total: Int) -> Tally { Tally(command: self, total: total) }
}

extension FleetCommand {
    /// Streams `method`'s per-store replies from the daemon into a tally and prints the
    /// summary; returns the exit code (130 after Ctrl-C, which ends the stream).
    public func runThroughDaemon(_ client: DaemonClient, method: String, parameters: [String: JSONValue],
                                 users: [String], all: Bool) async throws(CtlError) -> CtlExitCode {
        var parameters = parameters
        if all { parameters["all"] = true } else { parameters["users"] = .array(users.map { .string($0) }) }
        client.interruptOnSignal()
        let tally = tally(total: all ? 0 : users.count)
        do {
            // The last reply is the summary: it names no user.
            try await client.stream(method, parameters) { reply in if reply["user"] != nil { tally.record(reply) } }
        } catch {
            guard Interrupt.requested || error.exitCode == .interrupted else { throw error }
            return tally.finish(interrupted: true)
        }
        return tally.finish(interrupted: false)
    }

    /// The same work done `--offline`, on the data directory under the daemon's lock; Ctrl-C
    /// stops starting new stores.
    public func runOffline(configurationPath: String, users: [String], all: Bool, parallel: Int?, dryRun: Bool = false) async throws(CtlError) -> CtlExitCode {
        let fleet = try await OfflineFleet(configurationPath: configurationPath)
        var ids: [UserID] = all ? fleet.users() : []
        for user in users {
            do { ids.append(try UserID(user)) } catch { throw CtlError(.usage, "userstorectl: invalid user ID '\(user)': \(error)") }
        }
        let tally = tally(total: ids.count)
        Interrupt.watch()
        let kind = self.kind
        await fleet.forEach(ids, parallel: parallel ?? fleet.configuration.fleetParallelism, { registry, user in
            switch kind {
            case .migrate: await registry.fleet.migrate(user, dryRun: dryRun).replyFields
            case .verify: await registry.fleet.verify(user).replyFields
            }
        }, report: tally.record)
        return tally.finish(interrupted: Interrupt.requested)
    }
}
