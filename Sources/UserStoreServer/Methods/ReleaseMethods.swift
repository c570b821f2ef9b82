import Foundation
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin`'s release methods: the release in force, its staging, halt, resume
/// and abort (docs/releases.md). The decisions are ``Release``'s; ``ReleaseTracker`` keeps it.
struct ReleaseMethods {
    let context: DaemonContext
    private var tracker: ReleaseTracker { context.release }

    func handle(_ method: Method, _ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        switch method {
        case .release:
            // What the clock would do by now (a step whose wait is over, a release now complete)
            // is done before it is reported, not up to a second later.
            await tracker.tick()
            try await send(VarlinkReply.encode(tracker.status()))
        case .startRelease:
            let policy = try self.policy(parameters)
            try await send(VarlinkReply.encode(Self.brief(try await Self.mapped { try await tracker.start(policy) })))
        case .advanceRelease:
            try await send(VarlinkReply.encode(Self.brief(try await Self.mapped { try await tracker.advance() })))
        case .resumeRelease:
            try await send(VarlinkReply.encode(Self.brief(try await Self.mapped { try await tracker.resume() })))
        case .abortRelease:
            try await send(VarlinkReply.encode(try await abort()))
        case .trialRelease:
            try await trial(parameters, more: more, send: send)
        default:
            throw VarlinkError.methodNotFound(method.rawValue)
        }
    }

    /// StartRelease's parameters as a policy (InvalidRolloutPolicy naming what is wrong).
    private func policy(_ parameters: CallParameters) throws -> RolloutPolicy {
        guard let steps = try parameters.optionalNumbers("steps") else { throw VarlinkError.invalidParameter("steps") }
        let wait = try parameters.optionalInt("waitSeconds").map { Int(clamping: $0) } ?? RolloutPolicy.defaultWaitSeconds
        let canary = try parameters.optionalStrings("canary") ?? []
        let haltOn = try parameters.optionalNumber("haltOn") ?? RolloutPolicy.defaultHaltOn
        do throws(RolloutPolicyError) {
            return try RolloutPolicy(steps: steps, canary: canary, waitSeconds: wait, haltOn: haltOn)
        } catch {
            throw VarlinkError(.invalidRolloutPolicy, ["reason": .string(error.description)])
        }
    }

    /// Rolls back every store the release migrated, once the release is marked aborted (from
    /// then on no store migrates to its versions, so none is migrated again behind the run).
    private func abort() async throws -> [String: JSONValue] {
        let release = tracker.snapshot
        let migrations = context.registry.migrations
        let missingDown = release.newVersions.compactMap { version -> String? in
            guard let migration = migrations.migration(version: version) else { return nil }
            return migration.down == nil ? migration.fileName : nil
        }
        let aborted = try await Self.mapped { try await tracker.abort(missingDown: missingDown) }
        let base = aborted.baseLatest
        let index = context.index
        let serves = index.servesEntry()
        let users = index.reading { entries in entries.filter { $0.value.version > base && serves($0.value) }.map(\.key) }
        var rolledBack = 0
        var failed: [JSONValue] = []
        let registry = context.registry
        try await FleetRunner.run(users, parallel: context.configuration.fleetParallelism, operation: { user -> Result<Int64, StoreError> in
            do {
                // Stores the abort opened are closed again (a fleet run's rule).
                let (_, version) = try await registry.fleet.closingAfter(user) { try await registry.rollback(user, to: base) }
                index.update(user, version: version, failure: nil)
                return .success(version)
            } catch {
                return .failure((error as? StoreError) ?? .storageFailure(user: user, message: "\(error)"))
            }
        }, report: { user, outcome in
            switch outcome {
            case .success: rolledBack += 1
            case .failure(let error):
                failed.append(.object(["user": .string(user.rawValue), "error": .string(error.description), "errorName": .string(error.varlinkError.name)]))
            }
        })
        return ["id": .string(aborted.id), "state": .string(aborted.state.rawValue), "rolledBack": .integer(Int64(rolledBack)), "failed": .array(failed)]
    }

    /// Runs the loaded migrations on copies of `users`, or of `sample` stores (default 100)
    /// drawn at random among the known stores not at the latest version; one reply per store
    /// (with `more`), then the summary.
    private func trial(_ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        var users: [UserID] = []
        for user in try parameters.optionalStrings("users") ?? [] { users.append(try CallParameters.userID(user)) }
        let sample = try parameters.optionalInt("sample")
        guard users.isEmpty || sample == nil else { throw VarlinkError.invalidParameter("sample") }
        if users.isEmpty {
            let count = Int(sample ?? 100)
            guard count >= 1 else { throw VarlinkError.invalidParameter("sample") }
            await context.index.waitForScan()
            let latest = context.registry.migrations.latestVersion
            let serves = context.index.servesEntry()
            let behind = context.index.reading { entries in
                entries.filter { $0.value.version >= 0 && $0.value.version < latest && serves($0.value) }.map(\.key)
            }
            users = Array(behind.shuffled().prefix(count))
        }
        let parallel = Int(try parameters.optionalInt("parallel") ?? Int64(min(4, context.configuration.fleetParallelism)))
        guard (1...64).contains(parallel) else { throw VarlinkError.invalidParameter("parallel") }
        let trial = context.registry.trial
        var summary = TrialSummary()
        try await FleetRunner.run(users, parallel: parallel, operation: { user in await trial.run(user) }, report: { _, outcome in
            summary.add(outcome)
            if more { try await send(VarlinkReply.encode(Self.fields(outcome), continues: true)) }
        })
        try await send(VarlinkReply.encode(summary.fields))
    }

    private static func fields(_ outcome: TrialOutcome) -> [String: JSONValue] {
        var fields: [String: JSONValue] = [
            "user": .string(outcome.user.rawValue), "ok": .bool(outcome.ok), "milliseconds": .real((outcome.milliseconds * 1000).rounded() / 1000),
            "bytesBefore": .integer(outcome.bytesBefore), "bytesAfter": .integer(outcome.bytesAfter),
            "fromVersion": .integer(outcome.fromVersion), "toVersion": .integer(outcome.toVersion), "applied": .array(outcome.applied.map { .integer($0) }),
            "error": outcome.error.map { .string($0.description) } ?? .null,
        ]
        if let error = outcome.error { fields["errorName"] = .string(error.varlinkError.name) }
        return fields
    }

    /// The trial's totals: the predicted failure ratio, the durations, the sizes.
    private struct TrialSummary {
        var stores = 0, failed = 0
        var milliseconds: [Double] = []
        var bytesBefore: Int64 = 0, bytesAfter: Int64 = 0

        mutating func add(_ outcome: TrialOutcome) {
            stores += 1
            if !outcome.ok { failed += 1 }
            milliseconds.append(outcome.milliseconds)
            bytesBefore += outcome.bytesBefore
            bytesAfter += outcome.bytesAfter
        }

        var fields: [String: JSONValue] {
            let sorted = milliseconds.sorted()
            func quantile(_ q: Double) -> Double { sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))] }
            func rounded(_ value: Double) -> JSONValue { .real((value * 1000).rounded() / 1000) }
            return [
                "summary": .bool(true), "stores": .integer(Int64(stores)), "succeeded": .integer(Int64(stores - failed)), "failed": .integer(Int64(failed)),
                "predictedFailureRatio": .real(stores == 0 ? 0 : Double(failed) / Double(stores)),
                "millisecondsP50": rounded(quantile(0.5)), "millisecondsP99": rounded(quantile(0.99)), "millisecondsMax": rounded(sorted.last ?? 0),
                "millisecondsTotal": rounded(sorted.reduce(0, +)), "bytesBefore": .integer(bytesBefore), "bytesAfter": .integer(bytesAfter),
            ]
        }
    }

    private static func brief(_ release: Release) -> [String: JSONValue] {
        ["id": .string(release.id), "state": .string(release.state.rawValue), "step": .real(release.step)]
    }

    /// Runs `body`, turning a ``ReleaseError`` into its Varlink error.
    private static func mapped(_ body: () async throws -> Release) async throws -> Release {
        do {
            return try await body()
        } catch let error as ReleaseNotSaved {
            throw VarlinkError(.releaseNotSaved, ["message": .string(error.description)])
        } catch let error as ReleaseError {
            switch error {
            case .noRelease:
                throw VarlinkError(.noRelease, ["reason": .string(error.description)])
            case .notAllowed(let state, let action):
                throw VarlinkError(.releaseNotAllowed, ["state": .string(state.rawValue), "action": .string(action)])
            case .irreversible(let files):
                throw VarlinkError(.irreversibleRelease, ["migrations": .array(files.map { .string($0) })])
            }
        }
    }
}
