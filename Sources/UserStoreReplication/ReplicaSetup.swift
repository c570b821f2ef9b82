import Foundation
import Logging
import UserStoreConfiguration
import UserStoreCore
import UserStoreS3

/// What every replication engine stands on, made at start: the replica's storage (checked), its
/// identity (the marker against this data directory's binding) and, with one host, the writer
/// lease — taken before the daemon serves when it can be at once. Independent of how stores are
/// copied (docs/replication.md).
package struct ReplicaSetup: Sendable {
    package let storage: ReplicaStorage
    /// The replica's marker against this data directory's binding.
    package let identity: ReplicaIdentity
    /// With one host (no `cluster` section) on a `file://` or `s3://` replica.
    package let lease: LeaseKeeper?
    /// The replica could not be reached or verified at start (served degraded; checked again).
    package let problem: String?

    /// Why the daemon must not start: the exit code (`configuration` 78, `unavailable` 69) and
    /// the one line it prints.
    package struct Refusal: Error, CustomStringConvertible {
        package enum Code: Sendable { case configuration, unavailable }
        package let code: Code
        package let description: String
        /// The journal's `error` field (a named error), when there is one.
        package let name: String?

        package init(code: Code, description: String, name: String?) {
            self.code = code
            self.description = description
            self.name = name
        }
    }

    /// Checks the replica `settings` name and establishes its identity and, unless
    /// `clusterHost` is given (a cluster's writers are its bucket owners), the writer lease.
    /// Throws a ``Refusal`` for what will not fix itself: a bucket that does not exist or refuses
    /// the credentials, another replica's marker, an S3 server that ignores conditional writes.
    package static func prepare(_ settings: ReplicationSettings, layout: StoreLayout, clusterHost: String?,
                                logger: Logger) async throws(Refusal) -> ReplicaSetup {
        let storage: ReplicaStorage
        do {
            storage = try ReplicaStorage(settings)
        } catch {
            throw Refusal(code: .configuration, description: "\(error)", name: nil)
        }
        var problem: String?
        do {
            try await storage.check()
        } catch let error as S3Error where error.isMisconfiguration {
            // A bucket that is not there or refuses the credentials will not fix itself: serving
            // on would create new users' stores unreplicated and refuse every restore.
            throw Refusal(code: .configuration, description: "\(error) (replication.replica, replication.s3.*)", name: error.name)
        } catch {
            problem = "\(error)" // served degraded; checked again by the engine's health check
        }
        let identity: ReplicaIdentity
        do {
            identity = try ReplicaIdentity(storage: storage, layout: layout, host: clusterHost ?? HostName.current,
                                           replicaURL: settings.replica, logger: logger)
        } catch {
            throw Refusal(code: .unavailable, description: "\(error)", name: nil)
        }
        let verdict = await identity.check()
        if case .mismatch(let why) = verdict {
            // Another replica than this data directory's: a configuration that points elsewhere,
            // which serving on would mix with this directory's stores.
            throw Refusal(code: .configuration, description: "ReplicaMismatch: \(why)", name: "ReplicaMismatch")
        }
        problem = problem ?? verdict.problem
        guard clusterHost == nil else { return ReplicaSetup(storage: storage, identity: identity, lease: nil, problem: problem) }
        let lease = LeaseKeeper(storage: storage, identity: identity, host: HostName.current, leaseSeconds: settings.leaseSeconds, logger: logger)
        // Taken before serving when it can be at once (a new replica, a restart).
        await lease.round()
        if let leaseProblem = lease.snapshot.problem, leaseProblem.hasPrefix("ReplicaNoConditionalWrites") {
            throw Refusal(code: .configuration, description: leaseProblem, name: "ReplicaNoConditionalWrites")
        }
        return ReplicaSetup(storage: storage, identity: identity, lease: lease, problem: problem)
    }
}
