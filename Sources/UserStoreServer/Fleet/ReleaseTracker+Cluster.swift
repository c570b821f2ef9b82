import Foundation
import UserStoreCore

/// A cluster's release (``SharedRelease``): every change is made to etcd's record with a
/// compare-and-swap and then adopted here; every tick adopts what the other hosts changed, so
/// a step, a halt, a resume or an abort on any host reaches every host within a tick.
extension ReleaseTracker {
    /// Applies `body` to the cluster's release (this host's release when etcd has none yet),
    /// then adopts the result. Throws what `body` throws, or etcd's error.
    func mutateInCluster(_ body: (inout Release) throws -> Void) async throws -> Release {
        guard let shared else { preconditionFailure("mutateInCluster without a cluster") }
        let local = snapshot
        sharedState.withLock { $0.pushing += 1 }
        defer { sharedState.withLock { $0.pushing -= 1 } }
        guard let (release, revision) = try await shared.update({ remote in
            var next = remote ?? local
            try body(&next)
            return next
        }) else { return local }
        adopt(release, revision: revision)
        return release
    }

    /// A change this host made by itself (a failure, a success): made to the cluster's record
    /// too, in the background; meanwhile ticks adopt nothing older.
    func push(_ body: @escaping @Sendable (inout Release) -> Void) {
        sharedState.withLock { $0.pushing += 1 }
        Task {
            defer { sharedState.withLock { $0.pushing -= 1 } }
            do {
                guard let (release, revision) = try await shared?.update({ remote in
                    guard var next = remote, next.id == snapshot.id else { return nil }
                    body(&next)
                    return next
                }) else { return }
                adopt(release, revision: revision)
            } catch {
                logger.error("the cluster's release could not be updated (the next tick tries again to agree): \(error)")
            }
        }
    }

    /// This host loaded migrations (at start or on a reload): the cluster's release becomes
    /// theirs when they are new to it — unless they are a subset of its versions (this host
    /// runs an older build during a rolling deploy: it follows the newer release).
    func publishLoaded(policy: RolloutPolicy?) {
        let local = snapshot
        sharedState.withLock { $0.pushing += 1 }
        Task {
            defer { sharedState.withLock { $0.pushing -= 1 } }
            do {
                guard let (release, revision) = try await shared?.update({ remote in
                    guard let remote else { return local }
                    if remote.fingerprint == local.fingerprint || Set(local.versions).isSubset(of: remote.versions) { return nil }
                    return remote.successor(versions: local.versions, fingerprint: local.fingerprint, policy: policy, now: Date())
                }) else { return }
                adopt(release, revision: revision)
            } catch {
                logger.error("the cluster's release could not be read or written (the next tick tries again): \(error)")
            }
        }
    }

    /// Adopts the cluster's release when another host changed it, then moves it to its next
    /// step when that is due.
    func tickInCluster(now: Date) async {
        guard let shared else { return }
        do {
            if sharedState.withLock({ $0.pushing == 0 }), let (release, revision) = try await shared.read(),
               sharedState.withLock({ $0.pushing == 0 && $0.revision != revision }) {
                adopt(release, revision: revision)
            }
            let current = snapshot
            if current.state == .running, let policy = current.policy, current.stageIndex < policy.stages.count - 1,
               now.timeIntervalSince(current.stageStartedAt) >= Double(policy.waitSeconds) {
                let moved = try await mutateInCluster { _ = try $0.advance(now: now) }
                if moved.stageIndex != current.stageIndex { logStep(moved) }
            }
            try await completeInCluster(snapshot, now: now)
        } catch {
            logger.warning("the cluster's release could not be read from etcd (kept as it was): \(error)")
        }
    }

    /// No host knows every store of a cluster: at the release's last step each host reports
    /// (a key in etcd, bound to its lease) whether every store it knows in the buckets it owns
    /// is at the release's version — judged again every ``ReleaseTracker/rejudgeSeconds``, so a
    /// host that takes over a bucket with stores behind takes its report back — and the release
    /// is complete once every bucket is active and its owner has reported. Nothing is judged
    /// until this host's copies of the records are current (after a restart it would own
    /// nothing, and see no owner).
    func completeInCluster(_ current: Release, now: Date) async throws {
        guard let shared, current.state == .running else { return }
        if let policy = current.policy, current.stageIndex < policy.stages.count - 1 { return }
        guard let view = shared.view() else { return }
        let reported = reportedDone.withLock { $0 }
        var done = reported?.done ?? false
        if reported?.id != current.id || reported?.lease != view.lease || now.timeIntervalSince(reported?.judgedAt ?? .distantPast) >= Self.rejudgeSeconds {
            done = indexIsComplete && everyStore(atLeast: current.latest, in: view.owned)
            if reported?.id != current.id || reported?.done != done || reported?.lease != view.lease {
                try await shared.report(current.id, done: done, lease: view.lease)
            }
            reportedDone.withLock { $0 = (current.id, done, view.lease, now) }
        }
        guard done, let owners = view.owners, owners.isSubset(of: try await shared.hostsDone(current.id)) else { return }
        let completed = try await mutateInCluster { release in
            guard release.id == current.id else { return }
            _ = release.completeIfDone(everyStoreAtVersion: true)
        }
        guard completed.id == current.id, completed.state == .complete else { return }
        try await shared.forgetReports(of: completed.id)
        logger.notice("release \(completed.id) complete: the owner of every bucket has its stores at version \(completed.latest)", metadata: [
            "event": "release-complete", "release": .string(completed.id), "schema_version": .stringConvertible(completed.latest),
        ])
    }

    /// Makes `release` (etcd's record at `revision`) this host's: kept in release.json too, and
    /// the registry looks at every store again when what the gate allows changed.
    func adopt(_ release: Release, revision: Int64) {
        let previous: Release? = self.release.withLock { current in
            guard sharedState.withLock({ state in
                guard revision > state.revision else { return false }
                state.revision = revision
                return true
            }) else { return nil }
            let previous = current
            current = release
            save(release)
            return previous
        }
        guard let previous, previous != release else { return }
        carryOut(from: previous, to: release)
        if previous.state != release.state || previous.stageIndex != release.stageIndex || previous.id != release.id {
            logger.notice("release \(release.id) is \(release.state.rawValue) at step \(RolloutPolicy.format(release.step))% (the cluster's release)")
        }
    }
}
