import Logging

/// Fleet migration progress in the journal: at most one entry a second, and one at the end.
enum FleetProgressLog {
    static func record(_ progress: FleetProgress, context: DaemonContext, last: inout ContinuousClock.Instant) {
        guard ContinuousClock.now - last >= .seconds(1) || progress.done == progress.total else { return }
        last = .now
        log(progress, context: context, final: false)
        context.notifier.notify("STATUS=" + StatusReporter.statusText(context))
    }

    static func started(total: Int, context: DaemonContext) {
        context.notifier.notify("STATUS=" + StatusReporter.statusText(context))
    }

    static func finished(_ progress: FleetProgress, context: DaemonContext) {
        log(progress, context: context, final: true)
    }

    private static func log(_ progress: FleetProgress, context: DaemonContext, final: Bool) {
        let rate = context.counters.withLock { $0.fleet?.rate } ?? 0
        let text = "\(final ? "fleet migration finished" : "migrating"): \(progress.done)/\(progress.total) stores, \(progress.failures) failed, \(Int(rate))/s"
        context.logger.log(level: final && progress.failures > 0 ? .warning : .notice, "\(text)", metadata: [
            "event": "fleet-progress", "done": "\(progress.done)", "total": "\(progress.total)",
            "failed": "\(progress.failures)", "migrated": "\(progress.migrated)", "rate": "\(Int(rate))",
        ])
    }
}
