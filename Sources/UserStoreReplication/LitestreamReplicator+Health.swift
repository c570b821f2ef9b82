import Foundation
import UserStoreCore

/// The health check: which Litestream answers, what it replicates, and registering again what
/// it lacks after a fault.
extension LitestreamReplicator {
    /// Checks Litestream (`/info`, `/list`) and registers the open stores it lacks (opened while
    /// it did not answer, or every store after it restarted). Returns the stores it replicates
    /// again after a fault: each counts as registered only once ``ReplicaCheck`` compared its
    /// replica with it (``verified(_:)``).
    package func checkHealth() async -> [Store] {
        let instance: LitestreamControl.Instance
        let listed: [LitestreamControl.ListedDatabase]
        let asked = ContinuousClock.now
        do {
            instance = try await control.info()
            listed = try await control.list()
        } catch {
            unanswered(error)
            return []
        }
        let (regained, missing, letGo) = answered(instance, listed, asked: asked)
        // Closed stores it still replicates (it did not answer their unregistration): its final
        // sync ships what they kept in their WAL, then it lets go of them.
        for path in letGo {
            do {
                try await control.unregister(path, until: durableDeadline)
                state.withLock { _ = $0.unconfirmed.remove(path) }
            } catch {
                failed("unregister \(path)", error)
            }
        }
        var replicating = regained
        for store in missing where await registerAfterFault(store) { replicating.append(store) }
        return replicating
    }

    /// `store` was compared with its replica after a fault and they match: it counts as
    /// registered again.
    package func verified(_ store: Store) {
        state.withLock { state in
            if state.open[store.path]?.store === store { state.open[store.path]!.registered = true }
        }
        updateCheckpointing(of: store)
    }

    /// Whether every open store is registered, Litestream answers and the replica does: the
    /// outage is over.
    package var everyStoreRegistered: Bool {
        state.withLock { $0.unansweredSince == nil && $0.replicaProblem == nil && $0.open.values.allSatisfy(\.registered) }
    }

    /// Checks the replica itself — the bucket answers and takes the credentials, the folder is
    /// there — so that health says what reaches the replica, not only whether Litestream's
    /// socket answers.
    ///
    /// With a marker (`file://`, `s3://`), the look is a read of it (``ReplicaIdentity``): a
    /// replica that is missing or another one makes every open store count as unregistered
    /// (durable writes fail; each is compared with its replica once it is back).
    package func checkReplica() async {
        guard let identity else {
            do {
                try await storage.check()
                state.withLock { $0.replicaProblem = nil }
            } catch {
                replicaFailed(error)
            }
            return
        }
        let verdict = (try? await BlockingPool.run { identity.check() }) ?? .unknown("the check did not run")
        guard let problem = verdict.problem else {
            state.withLock { $0.replicaProblem = nil }
            // The replica is back (or first reached): the writer lease at once, not at the
            // keeper's next look.
            if let lease, lease.heldEpoch == nil { _ = try? await BlockingPool.run { lease.round() } }
            return
        }
        if verdict.refusesReplication {
            state.withLock { state in
                for path in state.open.keys { state.open[path]!.registered = false }
            }
        }
        replicaFailed(Problem(description: problem))
    }

    /// A problem the replica's check found, by name.
    package struct Problem: Error, CustomStringConvertible {
        package let description: String
        package init(description: String) { self.description = description }
    }

    /// The replica itself could not be reached or used (`error` names why): degraded until a
    /// check of it succeeds.
    package func replicaFailed(_ error: any Error) {
        state.withLock { $0.replicaProblem = "\(error)" }
        failed("the replica", error)
    }

    /// Since when no Litestream has answered the health check (nil while one answers).
    package var unansweredSince: ContinuousClock.Instant? { state.withLock { $0.unansweredSince } }

    /// No Litestream answered: every open store stops counting as registered (durable writes
    /// fail; each is compared with its replica before it counts again). If the Litestream that
    /// last answered has ended, nothing holds their WAL positions any more; if it lives (paused,
    /// hung), it does, and their WALs are kept until it answers or ends.
    private func unanswered(_ error: any Error) {
        state.withLock { state in
            if state.unansweredSince == nil { state.unansweredSince = .now }
            for path in state.open.keys { state.open[path]!.registered = false }
            if let pid = state.litestream?.pid, Self.hasEnded(pid) {
                for path in state.open.keys { state.open[path]!.released() }
                state.unconfirmed = []
            }
        }
        updateCheckpointing()
        failed("health check", error)
    }

    /// A Litestream answered with what it replicates (`listed`, asked for at `asked`). Returns
    /// the open stores it replicates that do not count as registered (after a fault: to be
    /// compared with their replica), those it lacks (to register), and the closed stores it
    /// still holds (to unregister).
    private func answered(_ instance: LitestreamControl.Instance, _ listed: [LitestreamControl.ListedDatabase],
                          asked: ContinuousClock.Instant) -> (regained: [Store], missing: [Store], letGo: [String]) {
        let known = Set(listed.map(\.path))
        let replicating = Set(listed.filter { $0.status == "replicating" }.map(\.path))
        let result = state.withLock { state -> ([Store], [Store], [String]) in
            state.unansweredSince = nil
            if let previous = state.litestream, previous != instance, Self.hasEnded(previous.pid) {
                // A new Litestream: the old one's positions ended with it.
                for path in state.open.keys { state.open[path]!.released() }
                state.unconfirmed = []
            }
            state.litestream = instance
            for database in listed { state.lastSync[database.path] = database.lastSyncAt }
            var regained: [Store] = [], missing: [Store] = []
            for (path, entry) in state.open {
                // Known to be held before this /list was asked for, and not in it: Litestream does
                // not hold it (it restarted, or a late unregistration reached it). A registration
                // still on its way is not known to be held: the /list may have been served before
                // Litestream took it (issue #38: clearing the hold then let a store's WAL be reset
                // behind the Litestream that did take it, once that Litestream was paused).
                if let since = entry.confirmedSince, since < asked, !known.contains(path) {
                    state.open[path]!.released()
                    state.open[path]!.registered = false
                } else if known.contains(path) {
                    // It does hold it: let go of it at close.
                    if entry.heldSince == nil { state.open[path]!.heldSince = asked }
                    if entry.confirmedSince == nil { state.open[path]!.confirmedSince = asked }
                }
                guard !replicating.contains(path) else {
                    if !entry.registered { regained.append(entry.store) }
                    continue
                }
                if entry.heldSince.map({ $0 < asked }) ?? true {
                    state.open[path]!.registered = false
                    missing.append(entry.store)
                }
            }
            state.unconfirmed.formIntersection(known)
            return (regained, missing, Array(state.unconfirmed))
        }
        updateCheckpointing()
        return result
    }

    /// Registers `store` again after a fault (it does not count as registered until checked).
    private func registerAfterFault(_ store: Store) async -> Bool {
        guard holdForRegistration(store) else { return false }
        do {
            let url = try prepareRegistration(store)
            try await control.register(store.path, replicaURL: url)
            state.withLock { state in
                if state.open[store.path]?.store === store { state.open[store.path]!.confirmedSince = .now }
            }
            return true
        } catch {
            notRegistered(store, error)
            return false
        }
    }
}
