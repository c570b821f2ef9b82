import Foundation

/// The migrations a reload (or a start-up) brought in, as one object that moves through the
/// fleet: which versions it adds to the ones before it, how far it has reached, and what
/// failed. A pure value: the daemon's release tracker persists it and carries out what its
/// transitions decide (docs/releases.md).
///
/// Without a ``RolloutPolicy`` a release is not staged: every store migrates on its next
/// request, as before releases existed, and the release is `complete` once every known store is
/// at its version.
public struct Release: Sendable, Equatable, Codable {
    public enum State: String, Sendable, Codable, CaseIterable {
        /// No release since the data directory was first served: nothing to roll out.
        case none
        /// Stores in the current step's cohort migrate (lazily and eagerly).
        case running
        /// Too many stores failed: nothing migrates until `release resume`.
        case halted
        /// The last step is reached and every known store is at the release's version.
        case complete
        /// Rolled back: every store stays at the versions before the release until a new one starts.
        case aborted
    }

    /// `r<unix time>-<fingerprint of versions>`.
    public var id: String
    public var state: State
    /// The versions loaded before this release (the ones it builds on).
    public var baseVersions: [Int64]
    /// The versions loaded with this release, ascending.
    public var versions: [Int64]
    /// ``MigrationSet/fingerprint`` of `versions`: a reload with the same versions (a corrected
    /// file, say) stays in this release.
    public var fingerprint: String
    /// The staging; nil: not staged.
    public var policy: RolloutPolicy?
    /// Index into ``RolloutPolicy/stages``.
    public var stageIndex = 0
    public var startedAt: Date
    public var stageStartedAt: Date
    /// Stores whose migration failed in this release (user → error), cleared by a resume.
    public var failures: [String: String] = [:]
    /// Why the release halted (while it is halted).
    public var haltReason: String?

    /// The state of a data directory before any release: `versions` in force, nothing to roll out.
    public static func baseline(versions: [Int64], fingerprint: String, now: Date) -> Release {
        Release(id: "r\(Int64(now.timeIntervalSince1970))-\(fingerprint)", state: .none, baseVersions: versions,
                versions: versions, fingerprint: fingerprint, policy: nil, startedAt: now, stageStartedAt: now)
    }

    /// How an operator is told there is no release (`release status` and a refused `release start` alike).
    public static let noReleaseText = "no release: no reload has brought a migration every store does not already have"

    /// The release that loading `versions` starts after this one (staged by `policy` when given).
    /// Versions that add nothing to the ones it builds on (a reload that only removed or
    /// corrected migrations) start no release: the result is a ``baseline(versions:fingerprint:now:)``.
    /// It builds on this one's versions once every store has them (none, complete); otherwise
    /// (running, halted, aborted) on the versions before this one, so that no store held back
    /// from this release gets its migrations through the next.
    public func successor(versions: [Int64], fingerprint: String, policy: RolloutPolicy?, now: Date) -> Release {
        let base = state == .none || state == .complete ? self.versions : baseVersions
        if Set(versions).isSubset(of: Set(base)) { return .baseline(versions: versions, fingerprint: fingerprint, now: now) }
        return Release(id: "r\(Int64(now.timeIntervalSince1970))-\(fingerprint)", state: .running, baseVersions: base,
                versions: versions, fingerprint: fingerprint, policy: policy, startedAt: now, stageStartedAt: now)
    }

    // MARK: What it allows

    /// The current step in percent of users (100 when not staged).
    public var step: Double { policy.map { $0.stages[stageIndex] } ?? 100 }

    /// The highest version before the release.
    public var baseLatest: Int64 { baseVersions.max() ?? 0 }
    /// The highest version of the release.
    public var latest: Int64 { versions.max() ?? 0 }
    /// The versions this release adds.
    public var newVersions: [Int64] { versions.filter { !Set(baseVersions).contains($0) } }

    /// Whether the current step reaches `user`.
    public func reaches(_ user: UserID) -> Bool {
        guard let policy else { return true }
        return Cohort.contains(user, percent: step, canary: policy.canary)
    }

    /// The versions `user`'s store may be migrated to now; nil: every loaded one.
    public func allowedVersions(for user: UserID) -> Set<Int64>? {
        switch state {
        case .none, .complete: return nil
        case .running: return reaches(user) ? nil : Set(baseVersions)
        case .halted, .aborted: return Set(baseVersions)
        }
    }

    /// Whether a store whose migration failed is served at the version it has (under a
    /// rollout policy) rather than refused with `MigrationFailed`.
    public var servesFailedStores: Bool { policy != nil }

    // MARK: Transitions

    /// The failure ratio of the current step: stores failed in this release over the known
    /// stores the current step reaches (at least 1).
    public func failureRatio(storesReached: Int) -> Double {
        Double(failures.count) / Double(max(1, storesReached))
    }

    /// Records that `user`'s store failed to migrate; halts the release when the failure
    /// ratio passes the policy's threshold. Returns whether it halted just now.
    public mutating func recordFailure(_ user: UserID, error: String, storesReached: Int) -> Bool {
        guard state == .running else { return false }
        failures[user.rawValue] = error
        guard let policy else { return false }
        let ratio = failureRatio(storesReached: storesReached)
        guard ratio > policy.haltOn else { return false }
        state = .halted
        haltReason = "\(failures.count) of \(max(1, storesReached)) stores of the \(RolloutPolicy.format(step))% step failed to migrate "
            + "(\(RolloutPolicy.percent(ratio: ratio)) > haltOn \(RolloutPolicy.percent(ratio: policy.haltOn)))"
        return true
    }

    /// Records that `user`'s store reached the release's version (a retried store is no longer failed).
    public mutating func recordSuccess(_ user: UserID) {
        failures[user.rawValue] = nil
    }

    /// Starts staging this release by `policy` (again, after a halt or an abort): the first
    /// stage, no failures. Stores already migrated stay migrated.
    public mutating func start(_ policy: RolloutPolicy, now: Date) throws(ReleaseError) {
        guard state != .none else { throw .noRelease }
        guard state != .complete else { throw .notAllowed(state: state, action: "start") }
        self.policy = policy
        state = .running
        stageIndex = 0
        stageStartedAt = now
        failures = [:]
        haltReason = nil
    }

    /// The next step when the current one has lasted its wait (or at once with `force`).
    /// Returns whether the step changed.
    public mutating func advance(now: Date, force: Bool = false) throws(ReleaseError) -> Bool {
        guard state == .running else {
            if force { throw .notAllowed(state: state, action: "advance") }
            return false
        }
        guard let policy, stageIndex < policy.stages.count - 1 else { return false }
        guard force || now.timeIntervalSince(stageStartedAt) >= Double(policy.waitSeconds) else { return false }
        stageIndex += 1
        stageStartedAt = now
        return true
    }

    /// Running again after a halt: the failures are forgotten (failed stores are retried on
    /// their next request), the step starts its wait again.
    public mutating func resume(now: Date) throws(ReleaseError) {
        guard state == .halted else { throw .notAllowed(state: state, action: "resume") }
        state = .running
        failures = [:]
        haltReason = nil
        stageStartedAt = now
    }

    /// Marks the release aborted (its migrations are then rolled back by the caller).
    /// `missingDown`: the release's migrations without a Down section — refused when any.
    public mutating func abort(missingDown: [String]) throws(ReleaseError) {
        guard state == .running || state == .halted || state == .complete else { throw .notAllowed(state: state, action: "abort") }
        guard missingDown.isEmpty else { throw .irreversible(missingDown) }
        state = .aborted
        haltReason = nil
    }

    /// Complete once the last step is reached and `everyStoreAtVersion`. Returns whether it
    /// completed just now.
    public mutating func completeIfDone(everyStoreAtVersion: Bool) -> Bool {
        guard state == .running, everyStoreAtVersion else { return false }
        if let policy, stageIndex < policy.stages.count - 1 { return false }
        state = .complete
        return true
    }
}

/// Why a release operation was refused.
public enum ReleaseError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No release since the data directory was first served.
    case noRelease
    /// The release's state does not allow it.
    case notAllowed(state: Release.State, action: String)
    /// An abort needs a Down section for each of these migrations (file names).
    case irreversible([String])

    public var description: String {
        switch self {
        case .noRelease: Release.noReleaseText
        case .notAllowed(let state, let action): "cannot \(action) a release that is \(state.rawValue)"
        case .irreversible(let files): "cannot abort: these migrations of the release have no -- Down section: " + files.joined(separator: ", ")
        }
    }
}
