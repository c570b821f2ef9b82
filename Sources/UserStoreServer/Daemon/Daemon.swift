import Foundation
import Logging
import ServiceLifecycle
import UserStoreCluster
import UserStoreClusterServing
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import UserStoreReplication
import UserStoreS3
import Varlink

/// `userstored`: loads the configuration and migrations, takes the data directory's lock,
/// serves the socket until SIGTERM/SIGINT, then drains and closes every store.
public enum Daemon {
    /// Exit codes (sysexits.h where one fits).
    public enum ExitCode: Int32 {
        case success = 0
        case failure = 1
        case configuration = 78 // EX_CONFIG
        case unavailable = 69 // EX_UNAVAILABLE: data directory locked, socket busy
    }

    /// Runs the daemon; returns its exit code. Problems before serving are printed as one line
    /// on stderr (and logged).
    public static func run(configurationPath: String, logTarget: DaemonConfiguration.LogTarget?) async -> ExitCode {
        let sqliteSettings = SQLiteProcessSettings.apply() // before anything opens a database
        MallocSettings.limitArenas(cores: ProcessInfo.processInfo.activeProcessorCount)
        // One descriptor per connection and two per open store: use the whole hard limit (systemd
        // sets a soft limit of 1,024 for compatibility with select()).
        var files = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        if getrlimit(resource, &files) == 0, files.rlim_cur < files.rlim_max {
            files.rlim_cur = files.rlim_max
            _ = setrlimit(resource, &files)
        }
        let configuration: DaemonConfiguration
        do {
            configuration = try await ConfigurationLoader.load(path: configurationPath)
        } catch {
            printError("userstored: configuration refused: \(error)")
            return .configuration
        }
        let (logger, journalWriter) = LoggerFactory.makeLogger(target: logTarget ?? configuration.logTarget)
        logger.info("userstored \(DaemonInfo.version) starting", metadata: [
            "event": "daemon-starting", "config": .string(configuration.sourcePath), "app_version": .string(configuration.appVersion.text),
        ])
        if !sqliteSettings { logger.warning("SQLite was initialised before its memory settings could apply", metadata: ["event": "sqlite-settings-late"]) }

        let migrations: MigrationSet
        do {
            migrations = try ConfigurationLoader.loadMigrations(configuration)
        } catch {
            logger.critical("migrations refused: \(error)", metadata: ["event": "daemon-failed"])
            printError("userstored: \(error)")
            return .configuration
        }
        // The key-encryption key and the key store, before any store can be opened.
        var keyring: StoreKeyring?
        if let encryption = configuration.encryption {
            do throws(EncryptionSettings.Refusal) {
                let store: any KeyStore
                do {
                    store = try encryption.openKeyStore(clusterEtcd: configuration.cluster?.etcd)
                } catch {
                    throw EncryptionSettings.Refusal(name: "KeyStoreUnavailable", description: "the key store cannot be opened: \(error)")
                }
                keyring = try await encryption.makeKeyring(store: store)
            } catch {
                logger.critical("encryption refused: \(error.name): \(error)", metadata: ["event": "daemon-failed", "error": .string(error.name)])
                printError("userstored: encryption: \(error.name): \(error)")
                return .configuration
            }
            logger.info("stores are encrypted; data keys in \(keyring!.store.location)", metadata: ["event": "encryption-ready"])
        }
        var registryConfiguration = configuration.registryConfiguration
        registryConfiguration.keyring = keyring
        let layout = StoreLayout(dataDirectory: configuration.dataDirectory)
        let lock: DataDirectoryLock
        do {
            lock = try DataDirectoryLock(layout: layout)
        } catch {
            logger.critical("\(error)", metadata: ["event": "daemon-failed"])
            printError("userstored: \(error)")
            return .unavailable
        }

        let index = FleetIndex(encrypting: keyring != nil)
        // Metrics are recorded only when they are served (absent metrics.listen: off, no cost).
        let metrics = configuration.metricsListen == nil ? nil : DaemonMetrics.bootstrap()
        var peerTLS: PeerTLS?
        if let tls = configuration.cluster?.tls {
            do {
                peerTLS = try PeerTLS(tls, configurationFile: configuration.sourcePath)
            } catch {
                logger.critical("configuration refused: \(error)", metadata: ["event": "daemon-failed"])
                printError("userstored: configuration refused: \(error)")
                return .configuration
            }
        }
        let cluster = configuration.cluster.map { DaemonCluster(settings: $0, tls: peerTLS, logger: logger) }
        // Weak: the cluster reaches the index through the registry's observers.
        if let cluster { index.serveOnly { [weak cluster] in cluster?.ownedBuckets() ?? [] } }
        // Before any store can migrate: the release decides which may (in a cluster, the one in etcd).
        let release: ReleaseTracker
        do {
            release = try ReleaseTracker(dataDirectory: layout.dataDirectory, migrations: migrations, policy: configuration.rollout, index: index,
                                         logger: logger, shared: cluster?.sharedRelease)
        } catch {
            logger.critical("\(error)", metadata: ["event": "daemon-failed"])
            printError("userstored: \(error)")
            return .unavailable
        }
        if cluster != nil { release.publishLoaded(policy: configuration.rollout) }
        let observer = ObserverFanOut(observers: [index, release, EventLogger(logger: logger)] + (metrics.map { [$0] } ?? []))
        var replicator: LogReplicator?
        if let settings = configuration.replication {
            do throws(ReplicaSetup.Refusal) {
                if !settings.unusedKeys.isEmpty {
                    logger.notice("replication: \(settings.unusedKeys.joined(separator: ", ")) from Litestream's time: accepted and unused (the daemon's own log replicates; docs/configuration.md)", metadata: [
                        "event": "configuration-keys-unused", "keys": .string(settings.unusedKeys.joined(separator: " ")),
                    ])
                }
                // The replica's identity (its marker against this data directory's binding) and,
                // with one host, its writer lease: before anything can be created, restored or
                // replicated.
                let setup = try await ReplicaSetup.prepare(settings, layout: layout, clusterHost: cluster?.settings.host, logger: logger)
                replicator = try LogReplicator.start(settings, setup: setup, layout: layout, cluster: cluster, logger: logger,
                                                     syncDuration: metrics.map { metrics -> @Sendable (Duration) -> Void in { metrics.replicationSyncDuration.record(duration: $0) } },
                                                     keyring: keyring)
            } catch {
                var metadata: Logger.Metadata = ["event": "daemon-failed"]
                if let name = error.name { metadata["error"] = .string(name) }
                logger.critical("replication refused: \(error)", metadata: metadata)
                printError("userstored: replication: \(error)")
                return error.code == .configuration ? .configuration : .unavailable
            }
        }
        let placement: (any StorePlacement)? = cluster ?? replicator?.lease
        let registry = StoreRegistry(configuration: registryConfiguration, migrations: migrations, lock: lock,
                                     observer: observer, replication: replicator, placement: placement, gate: release)
        // A host that lost the writer lease serves nothing and closes every store (each with its
        // final sync, into its old epoch's folder, which no restore reads once the new holder wrote).
        replicator?.lease?.onLost { Task { _ = await registry.closeStores { _ in true } } }
        if let replicator, let lease = replicator.lease {
            // A new epoch: the index of the bucket is listed again, and stores still open under
            // another epoch are closed (their next use opens them under this one).
            lease.onAcquired { epoch in
                replicator.leaseAcquired(epoch)
                Task { _ = await registry.closeStores { user in replicator.registeredEpoch(of: user).map { $0 != epoch } ?? false } }
            }
        }
        let leaseKeeper = replicator?.lease.map { lease in Task { await lease.run() } }
        cluster?.attach(registry)
        cluster?.attach(replicator?.identity)
        cluster?.attach(engine: replicator)
        release.attach(registry)
        do {
            for user in try registry.lifecycle.recoverInterruptedOperations() {
                logger.notice("finished the deletion of store '\(user)' that a crash had interrupted", metadata: [
                    "event": "store-deleted", "user": .string(user.rawValue),
                ])
            }
        } catch {
            logger.critical("cannot finish an interrupted deletion or clear the staging folder: \(error)", metadata: ["event": "daemon-failed"])
            printError("userstored: \(error)")
            return .unavailable
        }
        let context = DaemonContext(configuration: configuration, registry: registry, index: index, release: release, logger: logger, metrics: metrics,
                                    replicator: replicator, cluster: cluster)
        let notifier = context.notifier
        let stopExtension = configuration.replication.map { StopTimeExtension(durableTimeout: .milliseconds($0.durableTimeoutMilliseconds), notifier: notifier) }
        index.startScan(registry: registry)
        if configuration.registryConfiguration.policy.newStoresFromTemplate {
            // Before the socket serves, so that the very first new store is already a copy.
            do {
                try await registry.buildTemplate()
            } catch {
                logger.warning("new-store template not built, new stores are migrated step by step: \(error)", metadata: ["event": "template-failed"])
            }
        }

        let inherited = SystemdNotifier.inheritedSocket()
        let server: SocketServer
        do {
            server = try await SocketServer.bind(path: configuration.socketPath, inherited: inherited, context: context, logger: logger, onReady: {
                logger.notice("ready: serving \(inherited == nil ? configuration.socketPath : "the socket passed by systemd")", metadata: [
                    "event": "daemon-ready", "socket": .string(configuration.socketPath), "migrations": "\(migrations.migrations.count)",
                    "latest_version": "\(migrations.latestVersion)",
                ])
                printError("userstored: listening on \(inherited == nil ? configuration.socketPath : "socket fd \(inherited!) from systemd")")
                // Last: whoever waits for READY=1 finds the lines above already written.
                notifier.notify("READY=1\nSTATUS=" + StatusReporter.statusText(context))
            }, onStopping: {
                notifier.notify("STOPPING=1\nSTATUS=Stopping: finishing requests in flight")
                stopExtension?.begin()
                logger.notice("stopping: finishing requests in flight", metadata: ["event": "daemon-stopping"])
            })
        } catch {
            logger.critical("cannot serve the socket: \(error)", metadata: ["event": "daemon-failed"])
            printError("userstored: \(error)")
            return .unavailable
        }

        var metricsServices: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if let address = configuration.metricsListen {
            do {
                metricsServices.append(.init(service: try await MetricsServer.bind(address, context: context, logger: logger)))
            } catch {
                logger.critical("cannot serve metrics on \(address): \(error)", metadata: ["event": "daemon-failed"])
                printError("userstored: metrics.listen \(address): \(error)")
                return .unavailable
            }
        }
        let replicationServices: [ServiceGroupConfiguration.ServiceConfiguration] = (replicator?.services(registry: registry) ?? []).map { .init(service: $0) }
        var clusterServices: [ServiceGroupConfiguration.ServiceConfiguration] = cluster.map { [.init(service: $0)] } ?? []
        if let settings = configuration.cluster, let peerTLS, let listen = HostPort(settings.listen) {
            do {
                clusterServices.append(.init(service: try await PeerListener.bind(listen, tls: peerTLS, adopt: { [server] descriptor, peer in server.adopt(descriptor, peer: .forwarded(from: peer)) }, logger: logger)))
            } catch {
                logger.critical("cannot listen for other daemons on \(settings.listen): \(error)", metadata: ["event": "daemon-failed"])
                printError("userstored: cluster.listen \(settings.listen): \(error)")
                return .unavailable
            }
        }
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: metricsServices + replicationServices + clusterServices + [
                .init(service: WatchdogService(notifier: notifier, logger: logger)),
                .init(service: StatusReporter(context: context, notifier: notifier)),
                .init(service: IdleSweeper(registry: registry)),
                .init(service: FreePageReturner(registry: registry)),
                .init(service: ReleaseClock(release: release)),
                .init(service: HangupReloader(context: context)),
                .init(service: server, successTerminationBehavior: .gracefullyShutdownGroup),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        var exitCode = ExitCode.success
        do {
            try await group.run()
        } catch {
            logger.error("service failed: \(error)", metadata: ["event": "daemon-failed"])
            exitCode = .failure
        }
        stopExtension?.begin() // a stop systemd did not ask for (a service failed) waits as long
        await registry.shutdown()
        // Every record in the log (or the durable time-out passed) before another host may take
        // the stores over: what this host stored after that host's fence would not count. A
        // store's close does not wait for a log that is failing; this one wait covers them all.
        let stored = await replicator?.stop() ?? true
        await cluster?.leave() // the next owner restores it all (unless the log failed: logged above)
        if let leaseKeeper, let replicator, let lease = replicator.lease {
            // Kept until the log stored every record; given up then, so that another host takes
            // over at once — unless it did not: then it runs out, and the next host of this data
            // directory takes it back with the stores that hold what the replica lacks.
            leaseKeeper.cancel()
            await leaseKeeper.value
            if !stored {
                logger.warning("keeping the replica's writer lease until it runs out: replication is degraded (\(replicator.snapshot.lastError ?? "the log did not store every record in time"))", metadata: ["event": "replica-lease-released"])
            } else {
                await lease.release()
            }
        }
        stopExtension?.end()
        if inherited == nil { unlink(configuration.socketPath) }
        logger.notice("stopped: every store closed", metadata: ["event": "daemon-stopped"])
        journalWriter?.flush()
        return exitCode
    }

}

extension DaemonContext {
    /// Re-reads configuration and migrations (SIGHUP, `Reload`); keeps the old ones if either
    /// is invalid.
    func reload() async throws -> ReloadOutcome {
        notifier.notify("RELOADING=1\nSTATUS=Reloading configuration and migrations")
        defer { notifier.notify("READY=1\nSTATUS=" + StatusReporter.statusText(self)) }
        logger.notice("reloading configuration and migrations", metadata: ["event": "daemon-reloading"])
        let configuration = try await ConfigurationLoader.load(path: self.configuration.sourcePath)
        let migrations: MigrationSet
        do {
            migrations = try ConfigurationLoader.loadMigrations(configuration)
        } catch {
            let problems = (error as? MigrationSetError)?.problems.map(\.description) ?? ["\(error)"]
            throw Varlink.VarlinkError(.invalidMigrations, ["problems": .array(problems.map { .string($0) })])
        }
        for (key, changed) in Self.restartOnlyChanges(from: self.configuration, to: configuration) where changed {
            logger.warning("configuration key \(key) changed; it takes effect after a restart", metadata: ["event": "daemon-reloading"])
        }
        settings.withLock {
            $0 = RuntimeSettings(access: configuration.access, limits: configuration.limits, slowRequestMilliseconds: configuration.slowRequestMilliseconds)
        }
        // The release first: from the moment the registry has the new migrations, the gate
        // must hold back the stores the new release does not reach yet.
        release.reloaded(migrations, policy: configuration.rollout)
        registry.reload(migrations: migrations)
        let generation = registry.statistics.generation
        logger.notice("reloaded: \(migrations.migrations.count) migrations, latest version \(migrations.latestVersion)", metadata: [
            "event": "daemon-reloaded", "latest_version": "\(migrations.latestVersion)",
        ])
        return .init(migrations: migrations.migrations.count, latestVersion: migrations.latestVersion, generation: generation)
    }

    private static func restartOnlyChanges(from old: DaemonConfiguration, to new: DaemonConfiguration) -> [(String, Bool)] {
        [("appVersion", old.appVersion.text != new.appVersion.text), ("dataDirectory", old.dataDirectory != new.dataDirectory),
         ("socketPath", old.socketPath != new.socketPath), ("migrationsDirectory", old.migrationsDirectory != new.migrationsDirectory), ("schemaFile", old.schemaFile != new.schemaFile), ("metrics.listen", old.metricsListen != new.metricsListen),
         ("maxOpenStores", old.maxOpenStores != new.maxOpenStores), ("cacheIdleSeconds", old.cacheIdleSeconds != new.cacheIdleSeconds), ("migrations", old.policy != new.policy)]
    }
}

extension Daemon {
    static func printError(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }
}
