import Foundation
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import UserStoreReplication
import Varlink

/// `io.userstore.Admin.Replication` and `RestoreFromReplica`, and replication in `Status`.
struct ReplicationMethods {
    let context: DaemonContext

    /// Handles `request`, a call of `method` (one of these).
    func handle(_ method: Method, _ request: Request, send: @escaping ReplySink) async throws {
        let parameters = request.parameters
        switch method {
        case .replication:
            let user = try parameters.optionalString("user").map { text throws(VarlinkError) in try CallParameters.userID(text) }
            try await send(VarlinkReply.encode(try replication(user)))
        case .restoreFromReplica:
            let user = try parameters.user()
            var timestamp: Date?
            if let text = try parameters.optionalString("timestamp") {
                guard let parsed = RFC3339.parse(text) else { throw VarlinkError.invalidParameter("timestamp") }
                timestamp = parsed
            }
            let (restored, previous) = try await context.registry.lifecycle.restoreFromReplica(user, timestamp: timestamp)
            context.index.update(user, version: restored.schemaVersion, failure: nil)
            var fields: [String: JSONValue] = [
                "user": .string(user.rawValue), "source": .string(restored.source), "schemaVersion": .integer(restored.schemaVersion),
                "durationMicroseconds": .integer(restored.durationMicroseconds),
            ]
            if let previous { fields["previous"] = .string(previous) }
            try await send(VarlinkReply.encode(fields))
        case .initReplica:
            let replicator = try Self.replicator(context)
            do {
                let marker = try await replicator.initializeReplica()
                try await send(VarlinkReply.encode(["replicaId": .string(marker.id), "createdBy": .string(marker.createdBy),
                                                    "createdAt": .string(marker.createdAt)]))
            } catch {
                throw Self.refused("\(error)")
            }
        case .takeOverReplica:
            let replicator = try Self.replicator(context)
            do {
                let (held, previous) = try await replicator.takeOverReplica()
                var fields: [String: JSONValue] = ["holder": .string(held.holder), "epoch": .integer(held.epoch)]
                if let previous {
                    fields["previousHolder"] = .string(previous.holder)
                    fields["previousEpoch"] = .integer(previous.epoch)
                }
                try await send(VarlinkReply.encode(fields))
            } catch {
                throw Self.refused("\(error)")
            }
        default:
            throw VarlinkError.methodNotFound(request.name)
        }
    }

    /// The replicator, or `ReplicaRefused` when replication is off.
    private static func replicator(_ context: DaemonContext) throws(VarlinkError) -> LogReplicator {
        guard let replicator = context.replicator else { throw refused("replication is off (no replication section in the configuration)") }
        return replicator
    }

    private static func refused(_ reason: String) -> VarlinkError {
        VarlinkError(.replicaRefused, ["reason": .string(reason)])
    }

    /// `Status`'s `replication` (nil when replication is off).
    static func status(_ context: DaemonContext) -> JSONValue? {
        guard let replicator = context.replicator else { return nil }
        let snapshot = replicator.snapshot
        var fields: [String: JSONValue] = [
            "state": .string(snapshot.degraded ? "degraded" : "ok"),
            "replica": .string(replicator.settings.replica),
            "registeredStores": .integer(Int64(snapshot.registered)),
            "unregisteredStores": .integer(Int64(snapshot.unregistered)),
            "maxRegisteredStores": .integer(Int64(context.configuration.maxOpenStores)),
            // Litestream's field, now the log's lag: how long the oldest commit not yet stored has waited.
            "maxLagSeconds": .real((snapshot.log.oldestUnstoredSeconds * 1000).rounded() / 1000),
            "durableWrites": .bool(replicator.settings.durableWrites),
            "restoredStores": .integer(Int64(snapshot.restored)),
            // Fields of Litestream's time, kept for clients that read them (the .varlink file).
            "litestreamPid": 0,
            "litestreamVersion": "",
            "syncPassSeconds": .real(0),
            "longestSyncPassSeconds": .real(0),
            "divergedReplicas": 0,
            "syncs": .integer(Int64(snapshot.syncs)),
            "sharedSyncWaits": 0,
        ]
        if let error = snapshot.lastError { fields["lastError"] = .string(error) }
        if let problem = snapshot.replicaProblem { fields["replicaProblem"] = .string(problem) }
        if let indexed = replicator.indexedUsers { fields["replicaIndexUsers"] = .integer(Int64(indexed)) }
        fields["identity"] = .string({
            switch replicator.identity.verdict {
            case .verified: "verified"
            case .missing: "missing"
            case .mismatch: "mismatch"
            case .unknown: "unknown"
            }
        }())
        if let id = replicator.identity.binding.replica { fields["replicaId"] = .string(id) }
        if let lease = replicator.lease { fields["lease"] = Self.lease(lease) }
        fields["engine"] = "log"
        let log = snapshot.log
        var state: [String: JSONValue] = [
            "tailObjects": .integer(Int64(log.tailObjects)),
            "oldestUnstoredSeconds": .real((log.oldestUnstoredSeconds * 1000).rounded() / 1000),
            "pendingBytes": .integer(Int64(log.pendingBytes)),
            "objectsWritten": .integer(Int64(log.objectsWritten)),
            "objectsFolded": .integer(Int64(log.objectsFolded)),
            "foldSeconds": .integer(Int64(replicator.settings.foldSeconds)),
        ]
        if let error = log.foldError { state["foldError"] = .string(error) }
        fields["log"] = .object(state)
        return .object(fields)
    }

    /// `ReplicationStatus.lease`.
    private static func lease(_ keeper: LeaseKeeper) -> JSONValue {
        let lease = keeper.snapshot
        var fields: [String: JSONValue] = [
            "state": .string(lease.state), "thisHost": .string(keeper.host), "leaseSeconds": .integer(Int64(keeper.leaseSeconds)),
            "acquisitions": .integer(Int64(lease.acquisitions)), "losses": .integer(Int64(lease.losses)),
        ]
        if let holder = lease.holder { fields["holder"] = .string(holder) }
        if let epoch = lease.epoch { fields["epoch"] = .integer(epoch) }
        if let renewed = lease.renewedAt { fields["renewedAt"] = .string(renewed) }
        if let expires = lease.expiresAt { fields["expiresAt"] = .string(expires) }
        if let problem = lease.problem { fields["problem"] = .string(problem) }
        return .object(fields)
    }

    private func replication(_ user: UserID?) throws -> [String: JSONValue] {
        guard let replicator = context.replicator, let status = Self.status(context) else {
            throw Errors.replicationUnavailable(user: user?.rawValue ?? "", message: "replication is off (no replication section in the configuration)")
        }
        let open = replicator.snapshot.stores
        var stores: [JSONValue] = []
        func entry(_ name: String, open: Bool, registered: Bool) throws -> JSONValue {
            .object([
                "user": .string(name), "replica": .string(replicator.replicaURL(for: try UserID(name))),
                "open": .bool(open), "registered": .bool(registered),
            ])
        }
        if let user {
            let found = open.first { $0.user == user.rawValue }
            stores.append(try entry(user.rawValue, open: found != nil, registered: found?.registered ?? false))
        } else {
            for store in open { stores.append(try entry(store.user, open: true, registered: store.registered)) }
        }
        return ["replication": status, "stores": .array(stores)]
    }
}
