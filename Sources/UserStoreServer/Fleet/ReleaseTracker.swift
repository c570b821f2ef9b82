import Foundation
import Logging
import Synchronization
import UserStoreClusterServing
import UserStoreCore
import UserStoreReplication
import Varlink

/// The release in force on this host (docs/releases.md): which stores its current step lets
/// migrate (the registry's ``MigrationGate``), what failed (it hears every migration as a
/// ``StoreObserver``), when it halts, moves to its next step or completes. Kept in
/// `<dataDirectory>/release.json`, written durably on every change, so that a restart
/// resumes the release where it was instead of letting every store migrate.
///
/// In a cluster the release lives in etcd (``SharedRelease``): every change is made there and
/// adopted here, and every tick adopts what other hosts changed (ReleaseTracker+Cluster.swift).
///
/// Locking: its own mutex, inside which it reads the fleet index (never the other way round),
/// and nothing of the registry's (the registry asks the gate under its own lock).
final class ReleaseTracker: MigrationGate, StoreObserver {
    let release: Mutex<Release>
    private let path: String
    private let index: FleetIndex
    let logger: Logger
    let registry = Mutex<StoreRegistry?>(nil)
    /// The cluster's copy (cluster.*); nil: this host's alone.
    let shared: SharedRelease?
    /// The etcd revision of the cluster's release last adopted, and the changes of this host
    /// still on their way there (while any is, a tick does not adopt an older record).
    let sharedState = Mutex<(revision: Int64, pushing: Int)>((0, 0))
    /// What this host last reported to etcd as done (``SharedRelease/report(_:done:)``), and
    /// when it judged so (at most every ``ReleaseTracker/rejudgeSeconds``).
    let reportedDone = Mutex<(id: String, done: Bool, lease: Int64, judgedAt: Date)?>(nil)
    /// Judging whether this host is done reads its whole fleet index under the index's lock:
    /// every few seconds, not every tick.
    static let rejudgeSeconds: TimeInterval = 5
    /// Stores this release brought to its version since the daemon started (for the rate).
    private let migrated = Atomic<Int>(0)
    /// The last change could not be written (a full disk): kept in memory, written again by
    /// every tick until it is.
    private let unsaved = Atomic<Bool>(false)

    /// Reads the release kept in `dataDirectory`; when `migrations` are not that release's, a
    /// new release of them starts (staged by `policy` when given). The first time a data
    /// directory is served, its migrations are the baseline: nothing to roll out. Throws when
    /// the file exists but cannot be read or decoded, or cannot be written.
    init(dataDirectory: String, migrations: MigrationSet, policy: RolloutPolicy?, index: FleetIndex, logger: Logger,
         shared: SharedRelease? = nil, now: Date = Date()) throws {
        path = ReleaseFile.path(dataDirectory: dataDirectory)
        self.index = index
        self.logger = logger
        self.shared = shared
        let kept = FileManager.default.fileExists(atPath: path)
        let (current, started) = try ReleaseFile.current(at: path, migrations: migrations, policy: policy, now: now)
        release = Mutex(current)
        // Written only when it changed: a restart on the same migrations costs no fsync.
        if started || !kept { save(current) }
        if started { logStarted(current) }
    }

    /// Starts serving: the registry is reconsidered on every change of step or state.
    func attach(_ registry: StoreRegistry) {
        self.registry.withLock { $0 = registry }
        registry.setServesFailedStores(snapshot.servesFailedStores)
    }

    /// The release now.
    var snapshot: Release { release.withLock { $0 } }

    // MARK: MigrationGate

    func allowedVersions(for user: UserID) -> Set<Int64>? {
        release.withLock { $0.allowedVersions(for: user) }
    }

    // MARK: StoreObserver

    func record(_ event: StoreEvent) {
        switch event {
        case .migrationFailed(let user, let error):
            guard case .migrationFailed(_, let version, _, _, _, _) = error else { return }
            let halted: Release? = release.withLock { release in
                guard release.state == .running, release.newVersions.contains(version) else { return nil }
                let reached = storesReached(release)
                let halted = release.recordFailure(user, error: error.description, storesReached: reached)
                save(release)
                if shared != nil { push { _ = $0.recordFailure(user, error: error.description, storesReached: reached) } }
                return halted ? release : nil
            }
            if let halted { self.halted(halted) }
        case .migrationFinished(let user, _, let to, _, _):
            release.withLock { release in
                guard release.state == .running || release.state == .halted, to >= release.latest, release.latest > release.baseLatest else { return }
                migrated.add(1, ordering: .relaxed)
                if release.failures[user.rawValue] != nil {
                    release.recordSuccess(user)
                    save(release)
                    if shared != nil { push { $0.recordSuccess(user) } }
                }
            }
        default:
            return
        }
    }

    // MARK: Changes

    /// A reload loaded `migrations`: a new release when their versions differ from this one's.
    /// A reload is not refused because the release cannot be written now (a full disk): it is
    /// kept in memory and written once it can.
    func reloaded(_ migrations: MigrationSet, policy: RolloutPolicy?, now: Date = Date()) {
        let change: (Release, Release)? = release.withLock { release in
            guard release.fingerprint != migrations.fingerprint else { return nil }
            let previous = release
            release = release.successor(versions: migrations.migrations.map(\.version), fingerprint: migrations.fingerprint, policy: policy, now: now)
            save(release)
            return (previous, release)
        }
        if shared != nil { publishLoaded(policy: policy) }
        guard let (previous, started) = change else { return }
        carryOut(from: previous, to: started)
        if started.state == .none {
            logger.notice("release \(previous.id) replaced by the migrations reloaded: they bring no new version (schema version \(started.latest)); no release", metadata: [
                "event": "release-none", "release": .string(started.id), "schema_version": .stringConvertible(started.latest),
            ])
        } else {
            logStarted(started)
        }
    }

    /// `release start`: stages the release by `policy` from its first step.
    func start(_ policy: RolloutPolicy, now: Date = Date()) async throws -> Release {
        let started = try await mutate { try $0.start(policy, now: now) }
        logStarted(started)
        return started
    }

    /// `release next`: the next step now.
    func advance(now: Date = Date()) async throws -> Release {
        let before = snapshot.stageIndex
        let release = try await mutate { _ = try $0.advance(now: now, force: true) }
        if release.stageIndex != before { logStep(release) }
        return release
    }

    /// `release resume`: running again after a halt.
    func resume(now: Date = Date()) async throws -> Release {
        let release = try await mutate { try $0.resume(now: now) }
        logger.notice("release \(release.id) resumed at step \(RolloutPolicy.format(release.step))%", metadata: [
            "event": "release-resumed", "release": .string(release.id), "step_percent": .string(RolloutPolicy.format(release.step)),
        ])
        return release
    }

    /// `release abort`: refused (``ReleaseError/irreversible(_:)``) when one of `missingDown`
    /// exists; otherwise every store is held at the versions before the release from now on.
    func abort(missingDown: [String]) async throws -> Release {
        let release = try await mutate { try $0.abort(missingDown: missingDown) }
        logger.warning("release \(release.id) aborted: its migrations are rolled back, every store stays at version \(release.baseLatest)", metadata: [
            "event": "release-aborted", "release": .string(release.id), "base_version": .stringConvertible(release.baseLatest),
        ])
        return release
    }

    /// Moves to the next step when the current one has lasted its wait, and completes the
    /// release once its last step is reached and every known store is at its version. In a
    /// cluster: adopts what other hosts changed, moves the cluster's release to its next step
    /// when due (whichever host is first), and completes it once the owner of every bucket has
    /// reported its stores at the version (ReleaseTracker+Cluster.swift).
    func tick(now: Date = Date()) async {
        if shared != nil { return await tickInCluster(now: now) }
        enum Change { case step(from: Release, to: Release), complete(Release) }
        let change: Change? = release.withLock { release in
            if unsaved.load(ordering: .relaxed) { save(release) }
            guard release.state == .running else { return nil }
            let previous = release
            if (try? release.advance(now: now)) == true {
                save(release)
                return .step(from: previous, to: release)
            }
            guard index.isComplete, release.completeIfDone(everyStoreAtVersion: everyStore(atLeast: release.latest)) else { return nil }
            save(release)
            return .complete(release)
        }
        switch change {
        case .step(let previous, let release):
            carryOut(from: previous, to: release)
            logStep(release)
        case .complete(let release):
            logger.notice("release \(release.id) complete: every store is at version \(release.latest)", metadata: [
                "event": "release-complete", "release": .string(release.id), "schema_version": .stringConvertible(release.latest),
            ])
        case nil:
            return
        }
    }

    /// Applies `body` to the release: to the cluster's (then adopted here) or to this host's.
    func mutate(_ body: (inout Release) throws -> Void) async throws -> Release {
        guard shared != nil else { return try change(body) }
        return try await mutateInCluster(body)
    }

    /// Runs `body` on the release, persists it, and has the registry look at every store again.
    /// An operator's change that cannot be written is refused (``ReleaseNotSaved``), nothing changed.
    private func change(_ body: (inout Release) throws -> Void) throws -> Release {
        let (previous, changed) = try release.withLock { release in
            var next = release
            try body(&next)
            do {
                try ReleaseFile.write(next, to: path)
            } catch {
                throw ReleaseNotSaved(path: path, problem: "\(error)")
            }
            unsaved.store(false, ordering: .relaxed)
            defer { release = next }
            return (release, next)
        }
        carryOut(from: previous, to: changed)
        return changed
    }

    /// Carries a change of the release out on the registry: whether failed stores are served,
    /// and — when what the gate allows changed — every open store looked at again on its next
    /// use (stores whose migration failed are retried then).
    func carryOut(from previous: Release, to release: Release) {
        guard let registry = registry.withLock({ $0 }) else { return }
        registry.setServesFailedStores(release.servesFailedStores)
        if previous.id != release.id || previous.state != release.state || previous.stageIndex != release.stageIndex
            || previous.policy != release.policy {
            registry.reconsiderStores()
        }
    }

    // MARK: Counting

    /// Known stores the current step reaches (in a cluster, of the buckets this host owns: the
    /// copies it kept of buckets it gave away are not its to migrate).
    private func storesReached(_ release: Release) -> Int {
        let serves = index.servesEntry()
        return index.reading { entries in entries.reduce(0) { $0 + (release.reaches($1.key) && serves($1.value) ? 1 : 0) } }
    }

    /// Every known store (of the buckets in `buckets`, when given) is at `version` or past it,
    /// none failed.
    func everyStore(atLeast version: Int64, in buckets: Set<Int>? = nil) -> Bool {
        index.reading { entries in
            entries.values.allSatisfy { buckets?.contains($0.bucket) == false || ($0.version >= version && $0.failure == nil) }
        }
    }

    /// Whether the fleet index has read every store file (until then no store count is whole).
    var indexIsComplete: Bool { index.isComplete }

    // MARK: Status

    /// The failure ratio of the current step (failures over the known stores it reaches).
    func failureRatio(of release: Release) -> Double {
        release.failureRatio(storesReached: storesReached(release))
    }

    /// `Admin.Release`'s reply.
    func status(now: Date = Date()) -> [String: JSONValue] {
        let release = snapshot
        var versions: [String: JSONValue] = [:]
        var reached = 0, atVersion = 0, known = 0
        let serves = index.servesEntry()
        index.reading { entries in
            var counts: [Int64: Int] = [:]
            for (user, entry) in entries where serves(entry) {
                counts[entry.version, default: 0] += 1
                known += 1
                if release.reaches(user) { reached += 1 }
                if entry.version >= release.latest { atVersion += 1 }
            }
            for (version, count) in counts { versions[String(version)] = .integer(Int64(count)) }
        }
        let elapsed = max(1, now.timeIntervalSince(release.startedAt))
        let rate = Double(migrated.load(ordering: .relaxed)) / elapsed
        var fields: [String: JSONValue] = [
            "id": .string(release.id), "state": .string(release.state.rawValue), "staged": .bool(release.policy != nil),
            "step": .real(release.step), "baseVersion": .integer(release.baseLatest), "version": .integer(release.latest),
            "newVersions": .array(release.newVersions.map { .integer($0) }), "startedAt": .string(RFC3339.format(release.startedAt)),
            "stepStartedAt": .string(RFC3339.format(release.stageStartedAt)), "versions": .object(versions),
            "knownStores": .integer(Int64(known)), "storesReached": .integer(Int64(reached)), "storesAtVersion": .integer(Int64(atVersion)),
            "failed": .array(release.failures.keys.sorted().map { .string($0) }),
            "failures": .array(release.failures.sorted { $0.key < $1.key }.map { .object(["user": .string($0.key), "error": .string($0.value)]) }),
            "failureRatio": .real(release.failureRatio(storesReached: reached)),
            "ratePerSecond": .real((rate * 100).rounded() / 100),
        ]
        if let policy = release.policy {
            fields["steps"] = .array(policy.stages.map { .real($0) })
            fields["canary"] = .array(policy.canary.map { .string($0) })
            fields["waitSeconds"] = .integer(Int64(policy.waitSeconds))
            fields["haltOn"] = .real(policy.haltOn)
            if release.state == .running, release.stageIndex < policy.stages.count - 1 {
                let next = release.stageStartedAt.addingTimeInterval(Double(policy.waitSeconds))
                fields["nextStepAt"] = .string(RFC3339.format(next))
                let remaining = policy.stages.count - 1 - release.stageIndex
                fields["secondsToLastStep"] = .integer(Int64(max(0, next.timeIntervalSince(now)) + Double((remaining - 1) * policy.waitSeconds)))
            }
        }
        if rate > 0, release.state == .running {
            fields["secondsLeft"] = .integer(Int64(Double(max(0, reached - atVersion)) / rate))
        }
        if let reason = release.haltReason { fields["haltReason"] = .string(reason) }
        return fields
    }

    // MARK: Persistence and the journal

    /// Writes `release`; when it cannot be written, logs it once and leaves it to the next tick.
    func save(_ release: Release) {
        do {
            try ReleaseFile.write(release, to: path)
            if unsaved.exchange(false, ordering: .relaxed) {
                logger.notice("release \(release.id) written to \(path) again")
            }
        } catch {
            if !unsaved.exchange(true, ordering: .relaxed) {
                logger.error("release \(release.id) could not be written to \(path) (kept in memory, written again every second until it is): \(error)")
            }
        }
    }

    func halted(_ release: Release) {
        logger.error("release \(release.id) halted: \(release.haltReason ?? "")", metadata: [
            "event": "release-halted", "release": .string(release.id), "step_percent": .string(RolloutPolicy.format(release.step)),
            "failed_users": .string(release.failures.keys.sorted().prefix(100).joined(separator: ",")),
            "failed_stores": .stringConvertible(release.failures.count), "reason": .string(release.haltReason ?? ""),
        ])
    }

    func logStarted(_ release: Release) {
        let staging = release.policy.map { policy in
            "staged: " + policy.stages.map { RolloutPolicy.format($0) + "%" }.joined(separator: ", ")
                + (policy.canary.isEmpty ? "" : " (canary \(policy.canary.joined(separator: ", ")))")
                + ", \(policy.waitSeconds) s per step, halts past \(RolloutPolicy.percent(ratio: policy.haltOn)) failed"
        } ?? "not staged: every store migrates on its next request"
        logger.notice("release \(release.id) started: versions \(release.newVersions.map(String.init).joined(separator: ", ")) over version \(release.baseLatest), \(staging)", metadata: [
            "event": "release-started", "release": .string(release.id), "base_version": .stringConvertible(release.baseLatest),
            "schema_version": .stringConvertible(release.latest), "step_percent": .string(RolloutPolicy.format(release.step)),
        ])
    }

    func logStep(_ release: Release) {
        logger.notice("release \(release.id) moved to step \(RolloutPolicy.format(release.step))%", metadata: [
            "event": "release-step", "release": .string(release.id), "step_percent": .string(RolloutPolicy.format(release.step)),
        ])
    }
}

/// An operator's change of the release could not be written: refused, nothing changed.
struct ReleaseNotSaved: Error, CustomStringConvertible {
    let path: String
    let problem: String
    var description: String { "the release could not be written to \(path), nothing changed: \(problem)" }
}
