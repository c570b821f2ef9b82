import Foundation
import UserStoreCore
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin`'s release methods: the release in force, its staging, halt, resume
/// and abort (docs/rollout.md). The decisions are ``Release``'s; ``ReleaseTracker`` keeps it.
struct ReleaseMethods {
    let context: DaemonContext
    private var tracker: ReleaseTracker { context.release }

    func handle(_ method: Method, _ parameters: CallParameters, send: ReplySink) async throws {
        switch method {
        case .release:
            // What the clock would do by now (a step whose wait is over, a release now complete)
            // is done before it is reported, not up to a second later.
            tracker.tick()
            try await send(VarlinkReply.encode(tracker.status()))
        case .startRelease:
            let policy = try self.policy(parameters)
            try await send(VarlinkReply.encode(Self.brief(try Self.mapped { try tracker.start(policy) })))
        case .advanceRelease:
            try await send(VarlinkReply.encode(Self.brief(try Self.mapped { try tracker.advance() })))
        case .resumeRelease:
            try await send(VarlinkReply.encode(Self.brief(try Self.mapped { try tracker.resume() })))
        case .abortRelease:
            try await send(VarlinkReply.encode(try await abort()))
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
            throw VarlinkError("io.userstore.Admin.InvalidRolloutPolicy", ["reason": .string(error.description)])
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
        let aborted = try Self.mapped { try tracker.abort(missingDown: missingDown) }
        let base = aborted.baseLatest
        let index = context.index
        let users = index.reading { entries in entries.filter { $0.value.version > base }.map(\.key) }
        var rolledBack = 0
        var failed: [JSONValue] = []
        let registry = context.registry
        try await FleetRunner.run(users, parallel: context.configuration.fleetParallelism, operation: { user -> Result<Int64, StoreError> in
            do {
                let (_, version) = try await registry.rollback(user, to: base)
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

    private static func brief(_ release: Release) -> [String: JSONValue] {
        ["id": .string(release.id), "state": .string(release.state.rawValue), "step": .real(release.step)]
    }

    /// Runs `body`, turning a ``ReleaseError`` into its Varlink error.
    private static func mapped(_ body: () throws -> Release) throws -> Release {
        do {
            return try body()
        } catch let error as ReleaseNotSaved {
            throw VarlinkError("io.userstore.Admin.ReleaseNotSaved", ["message": .string(error.description)])
        } catch let error as ReleaseError {
            switch error {
            case .noRelease:
                throw VarlinkError("io.userstore.Admin.NoRelease", ["reason": .string(error.description)])
            case .notAllowed(let state, let action):
                throw VarlinkError("io.userstore.Admin.ReleaseNotAllowed", ["state": .string(state.rawValue), "action": .string(action)])
            case .irreversible(let files):
                throw VarlinkError("io.userstore.Admin.IrreversibleRelease", ["migrations": .array(files.map { .string($0) })])
            }
        }
    }
}
