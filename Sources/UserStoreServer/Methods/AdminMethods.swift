import Foundation
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// `io.userstore.Admin`: the operator's view of the fleet and what they can do to it.
struct AdminMethods {
    let context: DaemonContext
    private var registry: StoreRegistry { context.registry }

    func handle(_ method: Method, _ request: Request, peer: PeerIdentity, send: @escaping ReplySink) async throws {
        let parameters = request.parameters
        switch method {
        case .status: try await send(VarlinkReply.encode(status()))
        case .listStores:
            guard request.more else { throw VarlinkError.expectedMore() }
            try await listStores(parameters, send: send)
        case .migrate: try await migrate(parameters, more: request.more, send: send)
        case .plan: try await send(VarlinkReply.encode(plan(try parameters.user())))
        case .verify: try await verify(parameters, more: request.more, send: send)
        case .encryptStores: try await encryptStores(parameters, more: request.more, send: send)
        case .rollbackMigrations:
            let user = try parameters.user()
            let target = try parameters.int("toVersion")
            // A negative version would undo every migration: a typo, never a target.
            guard target >= 0 else { throw VarlinkError.invalidParameter("toVersion") }
            let (undone, version) = try await registry.rollback(user, to: target)
            context.index.update(user, version: version, failure: nil)
            try await send(VarlinkReply.encode(["user": .string(user.rawValue), "undone": .array(undone.map { .integer($0) }), "schemaVersion": .integer(version)]))
        case .backup:
            let user = try parameters.user()
            let path = try await registry.backup(user, to: try parameters.optionalString("path"))
            try await send(VarlinkReply.encode(["user": .string(user.rawValue), "path": .string(path)]))
        case .reload:
            let outcome = try await context.reload()
            try await send(VarlinkReply.encode(["migrations": .integer(Int64(outcome.migrations)), "latestVersion": .integer(outcome.latestVersion),
                                                "generation": .integer(Int64(outcome.generation))]))
        case .acceptChecksums:
            let user = try parameters.user()
            let versions = try parameters.optionalInts("versions").map(Set.init)
            let accepted = try await registry.acceptChecksums(user, versions: versions)
            try await send(VarlinkReply.encode(["user": .string(user.rawValue), "accepted": .array(accepted.map { .integer($0) })]))
        case .adminExecute: try await send(execute(request, parameters))
        case .top: try await send(VarlinkReply.encode(try top(parameters)))
        case .deleteStore, .exportStore, .importStore, .listBackups, .restoreStore, .rotateStoreKey:
            try await StoreLifecycleMethods(context: context).handle(method, request, send: send)
        case .replication, .restoreFromReplica, .initReplica, .takeOverReplica:
            try await ReplicationMethods(context: context).handle(method, request, send: send)
        case .cluster, .moveBucket, .drainHost, .rebalance:
            try await ClusterMethods(context: context).handle(method, request, send: send)
        case .queryStores:
            try await FleetQueryMethods(context: context).handle(request, parameters, more: request.more, send: send)
        case .release, .startRelease, .advanceRelease, .resumeRelease, .abortRelease, .trialRelease:
            try await ReleaseMethods(context: context).handle(method, parameters, more: request.more, send: send)
        case .open, .query, .execute, .batch, .begin, .commit, .rollback, .watch, .getInfo, .getInterfaceDescription:
            throw VarlinkError.methodNotFound(request.name)
        }
    }

    private func status() -> [String: JSONValue] {
        let latest = registry.migrations.latestVersion
        let (counts, otherHosts) = context.storeCounts()
        let statistics = registry.statistics
        let counters = context.counters.withLock { $0 }
        let known = counts.values.reduce(0, +)
        var fields: [String: JSONValue] = [
            "daemonVersion": .string(DaemonInfo.version),
            "appVersion": .string(context.configuration.appVersion.text),
            "latestSchemaVersion": .integer(latest),
            "migrations": .integer(Int64(registry.migrations.migrations.count)),
            "uptimeSeconds": .integer(Int64((ContinuousClock.now - context.started).inSeconds)),
            "dataDirectory": .string(context.configuration.dataDirectory),
            "socketPath": .string(context.configuration.socketPath),
            "openStores": .integer(Int64(statistics.openStores)),
            "maxOpenStores": .integer(Int64(context.configuration.maxOpenStores)),
            "knownStores": .integer(Int64(known)),
            "currentStores": .integer(Int64(counts[.current] ?? 0)),
            "pendingStores": .integer(Int64(counts[.pending] ?? 0)),
            "failedStores": .integer(Int64(counts[.failed] ?? 0)),
            "tooNewStores": .integer(Int64(counts[.tooNew] ?? 0)),
            "migrationsInFlight": .integer(Int64(statistics.preparing + counters.fleetMigrationsInFlight)),
            "connections": .integer(Int64(context.connections.count)),
            "indexComplete": .bool(context.index.isComplete),
        ]
        if context.configuration.encryption != nil || context.registry.configuration.keyring != nil {
            let (encrypted, plaintext) = context.index.encryptionCounts()
            fields["encryptedStores"] = .integer(Int64(encrypted))
            fields["plaintextStores"] = .integer(Int64(plaintext))
        }
        fields["replication"] = ReplicationMethods.status(context)
        if context.cluster != nil { fields["otherHostsStores"] = .integer(Int64(otherHosts)) }
        let release = context.release.snapshot
        if release.state != .none {
            fields["release"] = .object([
                "id": .string(release.id), "state": .string(release.state.rawValue), "step": .real(release.step),
                "version": .integer(release.latest), "failed": .integer(Int64(release.failures.count)),
                "failureRatio": .real(context.release.failureRatio(of: release)),
            ])
        }
        return fields
    }

    private func listStores(_ parameters: CallParameters, send: ReplySink) async throws {
        let filter = try parameters.optionalString("state").map { text throws(VarlinkError) -> FleetIndex.State in
            guard let state = FleetIndex.State(rawValue: text.replacingOccurrences(of: "-", with: "_")) else { throw .invalidParameter("state") }
            return state
        }
        let limit = try parameters.optionalInt("limit").map { Int(max(0, $0)) } ?? Int.max
        let latest = registry.migrations.latestVersion
        var selected: [JSONValue] = []
        for (user, entry) in await context.servedStores() {
            let state = FleetIndex.state(of: entry, latest: latest)
            if let filter, filter != state { continue }
            var fields: [String: JSONValue] = ["user": .string(user.rawValue), "schemaVersion": .integer(entry.version), "state": .string(state.rawValue)]
            if let failure = entry.failure { fields["error"] = .string(failure) }
            selected.append(.object(fields))
            if selected.count >= limit { break }
        }
        if selected.isEmpty { return try await send(VarlinkReply.encode([:])) }
        for (offset, store) in selected.enumerated() {
            try await send(VarlinkReply.encode(["store": store], continues: offset < selected.count - 1))
        }
    }

    /// The users a fleet call addresses: `users`, or with `all` every store this host serves
    /// (``DaemonContext/servedStores()``).
    private func targets(_ parameters: CallParameters) async throws -> [UserID] {
        let all = try parameters.optionalBool("all") ?? false
        let users = try parameters.optionalStrings("users") ?? []
        guard all != !users.isEmpty else { throw VarlinkError.invalidParameter(all ? "users" : "all") }
        if all { return await context.servedStores().map(\.0) }
        var ids: [UserID] = []
        for user in users { ids.append(try CallParameters.userID(user)) }
        return ids
    }

    private func migrate(_ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        let users = try await targets(parameters)
        let dryRun = try parameters.optionalBool("dryRun") ?? false
        let parallel = Int(try parameters.optionalInt("parallel") ?? Int64(context.configuration.fleetParallelism))
        guard (1...256).contains(parallel) else { throw VarlinkError.invalidParameter("parallel") }
        var progress = FleetProgress(total: users.count)
        context.counters.withLock {
            $0.fleetMigrationsInFlight += 1
            if !dryRun { $0.fleet = DaemonContext.FleetRun(total: users.count) }
        }
        defer { context.counters.withLock { $0.fleetMigrationsInFlight -= 1; if !dryRun { $0.fleet = nil } } }
        let shared = context
        var lastProgressLog = ContinuousClock.now
        if !dryRun { FleetProgressLog.started(total: users.count, context: shared) }
        let registry = self.registry, index = context.index
        try await FleetRunner.run(users, parallel: parallel, operation: { user -> [String: JSONValue] in
            let outcome = await registry.fleet.migrate(user, dryRun: dryRun)
            if !dryRun, let version = outcome.toVersion { index.update(user, version: version, failure: nil) }
            if case .migrationFailed(_, _, _, _, _, let version)? = outcome.error { index.update(user, version: version, failure: outcome.error) }
            return outcome.replyFields
        }, report: { user, outcome in
            progress.done += 1
            var fields = outcome
            if fields["state"] == "failed" {
                progress.failures += 1
                progress.failed.append(.object(["user": .string(user.rawValue), "error": fields["error"] ?? .null, "errorName": fields["errorName"] ?? .null]))
            }
            if fields["state"] == "migrated" { progress.migrated += 1 }
            if !dryRun {
                shared.counters.withLock { [progress] in $0.fleet?.done = progress.done; $0.fleet?.failures = progress.failures }
                FleetProgressLog.record(progress, context: shared, last: &lastProgressLog)
            }
            if more {
                fields.merge(progress.fields) { $1 }
                try await send(VarlinkReply.encode(fields, continues: true))
            }
        })
        if !dryRun { FleetProgressLog.finished(progress, context: shared) }
        var summary = progress.fields
        summary["failed"] = .array(progress.failed)
        try await send(VarlinkReply.encode(summary))
    }

    private func plan(_ user: UserID) async throws -> [String: JSONValue] {
        let plan = try await registry.plan(user)
        return [
            "user": .string(user.rawValue), "newStore": .bool(plan.isNewStore),
            "fromVersion": .integer(plan.fromVersion), "toVersion": .integer(plan.toVersion),
            "steps": .array(plan.steps.map { step in
                .object(["version": .integer(step.version), "migration": .string(step.fileName),
                         "sql": .array(step.up.map { .string($0) }), "skipped": .bool(plan.skippedVersions.contains(step.version)),
                         "dataLoss": step.dataLossReason.map { .string($0) } ?? .null])
            }),
            "reconcile": .array(plan.reconcileStatements.map { .string($0) }),
            "schemaFile": plan.reconcile ? .string(registry.migrations.schema?.fileName ?? "") : .null,
            "backup": plan.backup.map { .bool($0.copy) } ?? .null,
            "backupReason": plan.backup.map { .string($0.reason) } ?? .null,
        ]
    }

    private func verify(_ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        let users = try await targets(parameters)
        var progress = FleetProgress(total: users.count)
        let registry = self.registry
        try await FleetRunner.run(users, parallel: context.configuration.fleetParallelism, operation: { user -> [String: JSONValue] in
            await registry.fleet.verify(user).replyFields
        }, report: { user, outcome in
            progress.done += 1
            if outcome["ok"] != .bool(true) {
                progress.failures += 1
                progress.failed.append(.object(["user": .string(user.rawValue), "problems": outcome["problems"] ?? []]))
            }
            if more {
                var fields = outcome
                fields.merge(progress.fields) { $1 }
                try await send(VarlinkReply.encode(fields, continues: true))
            }
        })
        var summary = progress.fields
        summary["failed"] = .array(progress.failed)
        try await send(VarlinkReply.encode(summary))
    }

    /// EncryptStores: each plaintext store (with `all`, as the fleet index knows them) opened,
    /// which encrypts it (``StoreOpener``), on the daemon's fleet parallelism; progress per store.
    private func encryptStores(_ parameters: CallParameters, more: Bool, send: ReplySink) async throws {
        guard registry.configuration.keyring != nil else {
            throw VarlinkError.invalidRequest("encryption is off (no encryption section in the configuration)")
        }
        var users = try await targets(parameters)
        if try parameters.optionalBool("all") == true {
            let plaintext = Set(await context.servedStores().filter { !$0.1.encrypted }.map(\.0))
            users = users.filter(plaintext.contains)
        }
        var progress = FleetProgress(total: users.count)
        let registry = self.registry
        try await FleetRunner.run(users, parallel: context.configuration.fleetParallelism, operation: { user -> [String: JSONValue] in
            do {
                try await registry.withExistingStore(user) { _ in }
                return ["ok": true]
            } catch {
                let failure = Errors.from(error)
                let message = failure.parameters["message"] ?? failure.parameters["reason"] ?? .string("\(error)")
                return ["ok": false, "error": .string(failure.name), "message": message]
            }
        }, report: { user, outcome in
            progress.done += 1
            if outcome["ok"] == .bool(true) { progress.migrated += 1 } else {
                progress.failures += 1
                progress.failed.append(.object(["user": .string(user.rawValue), "errorName": outcome["error"] ?? .null, "error": outcome["message"] ?? .null]))
            }
            if more {
                var fields = outcome
                fields["user"] = .string(user.rawValue)
                fields.merge(progress.fields) { $1 }
                try await send(VarlinkReply.encode(fields, continues: true))
            }
        })
        var summary = progress.fields
        summary["failed"] = .array(progress.failed)
        try await send(VarlinkReply.encode(summary))
    }

    /// The busiest methods and users of the last seconds, with the daemon's gauges.
    private func top(_ parameters: CallParameters) throws -> [String: JSONValue] {
        guard let metrics = context.metrics else {
            throw VarlinkError(.metricsDisabled, ["reason": "metrics are off: set metrics.listen in the configuration (Top reads the same measurements)"])
        }
        let limit = Int(max(0, min(try parameters.optionalInt("limit") ?? 10, 1000)))
        var report = metrics.activity.report(seconds: Int(try parameters.optionalInt("seconds") ?? 5), limit: limit)
        let statistics = registry.statistics
        report["openStores"] = .integer(Int64(statistics.openStores))
        report["connections"] = .integer(Int64(context.connections.count))
        report["migrationsInFlight"] = .integer(Int64(statistics.preparing + context.counters.withLock { $0.fleetMigrationsInFlight }))
        report["transactionsOpen"] = .integer(Int64(metrics.transactionsOpen.load(ordering: .relaxed)))
        return report
    }

    private func execute(_ request: Request, _ parameters: CallParameters) async throws -> [UInt8] {
        try await StatementDispatch.leasedReply(.statement(try request.statement(), .both), of: request.message, for: try parameters.user(),
                                                access: .admin, context: context)
    }
}
