import Foundation
import Logging
import ServiceLifecycle
import UnixSignals
import UserStoreCore

/// Feeds systemd's watchdog every half interval while `WATCHDOG_USEC` is set. It runs apart from
/// the request and migration paths, so a long migration never starves it; a daemon whose
/// cooperative threads are all stuck stops feeding it and is restarted, as it should be.
///
/// Test-only fault switch: `USERSTORED_TEST_FAULT=stop-watchdog` stops the pings after the
/// first, to prove that systemd kills and restarts a hung daemon.
struct WatchdogService: Service {
    let notifier: SystemdNotifier
    let logger: Logger

    func run() async throws {
        guard let interval = notifier.watchdogInterval else { return try await gracefulShutdown() }
        let hang = ProcessInfo.processInfo.environment["USERSTORED_TEST_FAULT"] == "stop-watchdog"
        logger.info("watchdog enabled", metadata: ["interval_usec": "\(interval.wholeMicroseconds)"])
        while !Task.isShuttingDownGracefully {
            notifier.notify("WATCHDOG=1")
            if hang {
                logger.warning("test fault: watchdog pings stopped")
                return try await gracefulShutdown()
            }
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: interval / 2) }
            } catch {
                return // graceful shutdown: the group stops us last, after the requests drained
            }
        }
    }
}

/// Closes stores nobody used for `idleTimeoutSeconds`.
struct IdleSweeper: Service {
    let registry: StoreRegistry

    func run() async throws {
        let period = min(registry.configuration.idleTimeout / 2, .seconds(30))
        while !Task.isShuttingDownGracefully {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: period) }
            } catch {
                return
            }
            await registry.closeIdleStores()
        }
    }
}

/// Memory the daemon can do without goes back, on the blocking pool (docs/performance.md,
/// "Memory"):
/// - every second, the page caches of stores nobody used for `cacheIdleSeconds`
///   (``StoreRegistry/releaseIdleMemory(idleFor:now:)``): an open store used once in a while
///   keeps no pages meanwhile, and its next request reads them from the file again; a store in
///   steady use is never idle that long;
/// - every ten seconds, malloc's free pages (``MallocSettings/returnFreePages()``): stores
///   opened and closed all day leave free pages inside malloc's heaps that stay resident
///   otherwise, and a call costs milliseconds.
struct FreePageReturner: Service {
    let registry: StoreRegistry
    let tick: Duration = .seconds(1)
    let trimEvery = 10

    func run() async throws {
        var round = 0
        while !Task.isShuttingDownGracefully {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: tick) }
            } catch {
                return
            }
            round += 1
            let trim = round % trimEvery == 0
            await BlockingPool.run { [registry] in
                if let idle = registry.configuration.cacheIdle { registry.releaseIdleMemory(idleFor: idle) }
                if trim { MallocSettings.returnFreePages() }
            }
        }
    }
}

/// Moves a staged release to its next step once the current one has lasted its wait, and
/// marks it complete once every store is at its version (``ReleaseTracker/tick(now:)``).
struct ReleaseClock: Service {
    let release: ReleaseTracker

    func run() async throws {
        while !Task.isShuttingDownGracefully {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) }
            } catch {
                return
            }
            await release.tick()
        }
    }
}

/// `SIGHUP` = `Reload`: re-reads configuration and migrations.
struct HangupReloader: Service {
    let context: DaemonContext

    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup)
        for await _ in signals.cancelOnGracefulShutdown() {
            do {
                _ = try await context.reload()
            } catch {
                context.logger.error("reload failed; the previous configuration and migrations stay in force", metadata: ["error": "\(error)"])
            }
        }
    }
}

/// Keeps `systemctl status` current through `STATUS=`: open stores, migrations in flight, and
/// the progress of a fleet migration.
struct StatusReporter: Service {
    let context: DaemonContext
    let notifier: SystemdNotifier

    func run() async throws {
        var last = ""
        while !Task.isShuttingDownGracefully {
            let text = Self.statusText(context)
            if text != last {
                notifier.notify("STATUS=" + text)
                last = text
            }
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) }
            } catch {
                return
            }
        }
    }

    static func statusText(_ context: DaemonContext) -> String {
        let statistics = context.registry.statistics
        let counters = context.counters.withLock { $0 }
        if let fleet = counters.fleet {
            return "Migrating \(fleet.done)/\(fleet.total) stores, \(fleet.failures) failed, \(Int(fleet.rate))/s"
        }
        let failed = context.storeCounts().served[.failed] ?? 0
        return "Serving \(statistics.openStores) open stores, \(statistics.preparing) migrating, \(failed) failed, \(context.connections.count) connections"
    }
}
