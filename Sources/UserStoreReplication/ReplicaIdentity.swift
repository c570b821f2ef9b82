import Foundation
import Logging
import Synchronization
import UserStoreCore

/// Which replica this data directory replicates to, and whether the replica configured is still
/// that one (docs/replication.md, "The replica's identity").
///
/// A replica that vanishes — an unmounted `file://` folder (an empty mount point), a folder
/// replaced by a file, an S3 prefix emptied or pointed elsewhere — looks like a replica that
/// holds nothing, and "nothing there" would make every returning user a new, empty store. So a
/// replica carries a marker (``ReplicaMarker``) and the data directory the ID of its replica
/// (``ReplicaBinding``), and replication is usable only while the two match. Only an empty data
/// directory meeting an empty replica starts a new one by itself; a replica with contents and no
/// marker (made before markers) is adopted; an operator says on purpose that a replica is new
/// (``initialize()``, `userstorectl replication init`).
package final class ReplicaIdentity: Sendable {
    /// What the last look at the replica found.
    package enum Verdict: Sendable, Equatable {
        /// The marker is there and is this data directory's replica.
        case verified(ReplicaMarker)
        /// The replica could not be asked (not yet, or an outage): `why`.
        case unknown(String)
        /// `ReplicaMissing`: no marker where this data directory expects its replica (empty,
        /// gone, not a folder).
        case missing(String)
        /// `ReplicaMismatch`: the marker names another replica.
        case mismatch(String)

        /// The named problem (`ReplicaMissing: …`), nil when verified.
        package var problem: String? {
            switch self {
            case .verified: nil
            case .unknown(let why): why
            case .missing(let why): "ReplicaMissing: \(why)"
            case .mismatch(let why): "ReplicaMismatch: \(why)"
            }
        }

        /// Missing or another replica: nothing may be created, restored or acknowledged as
        /// replicated until it is back (an outage, ``unknown(_:)``, leaves that to each request).
        package var refusesReplication: Bool {
            switch self {
            case .missing, .mismatch: true
            case .verified, .unknown: false
            }
        }

        package var isVerified: Bool { if case .verified = self { true } else { false } }
    }

    private struct State {
        var binding: ReplicaBinding
        var verdict: Verdict = .unknown("the replica has not been looked at yet")
    }

    package let storage: ReplicaStorage
    package let layout: StoreLayout
    /// This host's name, written into a new marker.
    package let host: String
    /// `replication.replica`, for messages and the binding.
    package let replicaURL: String
    private let logger: Logger
    private let state: Mutex<State>
    /// One look at a time: two could store an older verdict over a newer one, or race their
    /// marker writes.
    private let looks = AsyncLock()

    /// The objects the daemon keeps at a replica's root (left out of "what the replica holds").
    package static let ownObjects: Set<String> = [ReplicaMarker.name, ReplicaLease.name]

    /// Loads the data directory's binding (throws when it cannot be read).
    package init(storage: ReplicaStorage, layout: StoreLayout, host: String, replicaURL: String, logger: Logger) throws {
        self.storage = storage
        self.layout = layout
        self.host = host
        self.replicaURL = replicaURL
        self.logger = logger
        let binding = try ReplicaBinding.load(layout)
        // The directory's own ID is kept from the first start on (the writer lease names it).
        if access(layout.replicaBindingPath, F_OK) != 0 { try binding.save(layout) }
        state = Mutex(State(binding: binding))
    }

    package var verdict: Verdict { state.withLock { $0.verdict } }
    package var binding: ReplicaBinding { state.withLock { $0.binding } }

    /// Looks at the replica's marker and judges it against the data directory's binding; binds
    /// this directory (a new replica, an adopted one, or one another host made) where the rules
    /// allow. Logs every change of verdict. One or two requests to the replica.
    @discardableResult
    package func check() async -> Verdict {
        await BlockingPool.executing { await looks.exclusive { await checkAlone() } }
    }

    private func checkAlone() async -> Verdict {
        let verdict = await judge()
        let previous = state.withLock { state -> Verdict in
            defer { state.verdict = verdict }
            return state.verdict
        }
        if verdict.refusesReplication, previous != verdict {
            logger.critical("the replica \(replicaURL) is not this data directory's: \(verdict.problem ?? ""); nothing is created, restored or acknowledged as replicated until it is back", metadata: [
                "event": "replica-unverified", "error": .string(verdict.problem ?? ""), "replica": .string(replicaURL),
            ])
        } else if case .verified(let marker) = verdict, previous.refusesReplication {
            logger.notice("the replica \(replicaURL) is back: \(marker.summary)", metadata: [
                "event": "replica-verified", "replica": .string(replicaURL), "replica_id": .string(marker.id),
            ])
        }
        return verdict
    }

    /// Reads the marker now and throws `ReplicationUnavailable` for `user` unless it is this
    /// directory's replica: asked before a user the replica holds nothing of is created (a look
    /// that found nothing must not be an empty mount point or an emptied prefix).
    package func confirm(before user: UserID) async throws {
        let verdict = await check()
        guard verdict.isVerified else {
            throw StoreError.replicationUnavailable(user: user, message: "the replica holds nothing of the user, but it is not known to be this data directory's replica now (\(verdict.problem ?? "")); nothing was created")
        }
    }

    /// Records that this data directory took the writer lease at `epoch` (durably): a later
    /// epoch is always above it. Blocking.
    package func recordEpoch(_ epoch: Int64) throws {
        var binding = self.binding
        guard binding.lastEpoch.map({ $0 < epoch }) ?? true else { return }
        binding.lastEpoch = epoch
        try binding.save(layout)
        state.withLock { $0.binding = binding }
    }

    /// The next start's incarnation on this data directory (1, 2, 3, …), recorded durably: the
    /// host log's objects of a later start sort after an earlier's.
    package func nextIncarnation() throws -> Int {
        var binding = self.binding
        let next = (binding.incarnations ?? 0) + 1
        binding.incarnations = next
        try binding.save(layout)
        state.withLock { $0.binding = binding }
        return next
    }

    /// Throws `ReplicationUnavailable` for `user` while the replica is missing or another one.
    package func require(for user: UserID) throws(StoreError) {
        let verdict = self.verdict
        guard !verdict.refusesReplication else {
            throw .replicationUnavailable(user: user, message: "\(verdict.problem ?? ""); nothing was created")
        }
    }

    /// `userstorectl replication init`: the replica configured is this data directory's, new.
    /// Writes a marker to a replica that has none (empty, or with contents of its own) and binds
    /// this directory to it; refuses a replica that already has one unless it is this
    /// directory's. Returns the marker.
    package func initialize() async throws -> ReplicaMarker {
        try await BlockingPool.executing { try await looks.exclusive { try await initializeAlone() } }
    }

    private func initializeAlone() async throws -> ReplicaMarker {
        let found = try await storage.readObject(ReplicaMarker.name).flatMap { ReplicaMarker(json: $0.data) }
        if let found {
            guard found.id == binding.replica else {
                throw InitRefused(description: "the replica \(replicaURL) already has a marker: \(found.summary); init marks only a replica without one (point replication.replica at another prefix or folder, or remove \(layout.replicaBindingPath) to bind this data directory to that replica)")
            }
            state.withLock { $0.verdict = .verified(found) }
            return found
        }
        let marker = ReplicaMarker(createdBy: host, dataDirectory: binding.dataDirectory, adopted: false)
        guard try await storage.writeObject(ReplicaMarker.name, marker.json, condition: .absent) != nil else {
            throw InitRefused(description: "another host wrote the replica's marker meanwhile; look at it with userstorectl replication and retry")
        }
        try await bind(marker)
        logger.notice("replica \(replicaURL) initialised by the operator: \(marker.summary)", metadata: [
            "event": "replica-created", "replica": .string(replicaURL), "replica_id": .string(marker.id), "reason": "operator",
        ])
        state.withLock { $0.verdict = .verified(marker) }
        return marker
    }

    /// Why ``initialize()`` refused.
    package struct InitRefused: Error, CustomStringConvertible {
        package let description: String
    }

    // MARK: Judging

    private func judge() async -> Verdict {
        let binding = self.binding
        let found: ReplicaStorage.StoredObject?
        do {
            found = try await storage.readObject(ReplicaMarker.name)
        } catch let problem as ReplicaStorage.FolderProblem where problem.name == "ReplicaNotAFolder" {
            return .missing("\(problem.detail) (the replica's folder was replaced); this data directory replicates to \(binding.replica.map { "replica \($0)" } ?? "it")")
        } catch {
            return .unknown("\(error)")
        }
        if let found {
            guard let marker = ReplicaMarker(json: found.data) else {
                return .mismatch("\(replicaURL)/\(ReplicaMarker.name) is not a marker userstored wrote")
            }
            guard let bound = binding.replica else {
                // A new data directory on an existing replica (a new host, a lost disk).
                do { try await bind(marker) } catch { return .unknown("recording the replica's ID in \(layout.replicaBindingPath): \(error)") }
                logger.notice("this data directory now replicates to \(marker.summary)", metadata: [
                    "event": "replica-created", "replica": .string(replicaURL), "replica_id": .string(marker.id), "reason": "bound",
                ])
                return .verified(marker)
            }
            if bound != marker.id, marker.dataDirectory == binding.dataDirectory {
                // This data directory wrote that marker and stopped before recording its ID.
                do { try await bind(marker) } catch { return .unknown("recording the replica's ID in \(layout.replicaBindingPath): \(error)") }
                return .verified(marker)
            }
            guard bound == marker.id else {
                return .mismatch("\(replicaURL) is \(marker.summary), but this data directory replicates to replica \(bound) (replication.replica points at another replica; if this data directory is meant to move there, remove \(layout.replicaBindingPath))")
            }
            return .verified(marker)
        }
        let contents: Bool
        do {
            contents = try await storage.holdsAnything(besides: Self.ownObjects)
        } catch {
            return .unknown("\(error)")
        }
        if let bound = binding.replica {
            return .missing("\(replicaURL) has no marker\(contents ? "" : " and is empty"), but this data directory replicates to replica \(bound): an unmounted folder or an emptied prefix looks like this. Bring the replica back, or, if it is meant to be new, run userstorectl replication init")
        }
        if !contents, await BlockingPool.run({ [layout] in layout.holdsAnyStore() }) {
            return .missing("\(replicaURL) is empty, but this data directory holds stores: an unmounted folder or an emptied prefix looks like this. Bring the replica back, or, if replication is new to this data directory or the replica is meant to be new, run userstorectl replication init")
        }
        // An empty data directory meeting an empty replica starts a new one; a replica with
        // contents and no marker was made before markers existed and is adopted.
        let marker = ReplicaMarker(createdBy: host, dataDirectory: binding.dataDirectory, adopted: contents)
        do {
            guard try await storage.writeObject(ReplicaMarker.name, marker.json, condition: .absent) != nil else {
                return await judge() // another host wrote one meanwhile: judge that one
            }
            try await bind(marker)
        } catch {
            return .unknown("writing the replica's marker: \(error)")
        }
        logger.notice("\(contents ? "adopted the replica" : "started a new replica") \(replicaURL): \(marker.summary)", metadata: [
            "event": "replica-created", "replica": .string(replicaURL), "replica_id": .string(marker.id), "reason": .string(contents ? "adopted" : "new"),
        ])
        return .verified(marker)
    }

    /// Records `marker`'s ID in the data directory's binding, durably (on a blocking-pool thread).
    private func bind(_ marker: ReplicaMarker) async throws {
        var binding = self.binding
        binding.replica = marker.id
        binding.replicaURL = replicaURL
        try await BlockingPool.run { [binding, layout] in try binding.save(layout) }
        state.withLock { $0.binding = binding }
    }
}
