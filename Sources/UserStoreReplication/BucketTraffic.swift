import AsyncHTTPClient
import NIOCore
import Synchronization

/// What Litestream sent to the bucket — requests and bytes by S3 operation — read from its
/// Prometheus page (`replication.litestreamMetricsAddress`) whenever the daemon's own `/metrics`
/// is scraped, and summed across Litestream's restarts: a new Litestream counts from zero, the
/// daemon's totals never go back.
///
/// Counted by Litestream's S3 client itself (`litestream_replica_operation_total` and
/// `litestream_replica_operation_bytes`), so they include what the daemon never sees: Litestream's
/// own syncs, compactions and retention deletes. A `file://` replica counts nothing.
package final class BucketTraffic: Sendable {
    /// Requests and bytes by operation (`PUT`, `GET`, `DELETE`, `LIST`).
    package struct Counts: Equatable, Sendable {
        package var requests: [String: Int64] = [:]
        package var bytes: [String: Int64] = [:]

        package init() {}
    }

    /// One reading of Litestream's page.
    package struct Page: Equatable {
        /// `process_start_time_seconds`: which Litestream counted (a new one starts from zero).
        var started: Double?
        var counts = Counts()
    }

    /// `host:port` of Litestream's page (nil: the daemon's own requests, ``init(counting:)``).
    package let address: String?
    /// The daemon's own client's counts, read at each refresh instead of a page.
    private let source: (@Sendable () -> Counts)?
    private let state = Mutex(State())

    private struct State {
        var totals = Counts()
        /// The last page read: what of it is already in `totals`.
        var last = Page()
        var lastError: String?
    }

    package init(address: String) {
        self.address = address
        source = nil
    }

    /// What the daemon itself sends to the bucket (the host log's engine): `source` gives its S3
    /// client's counts since start, read at each refresh.
    package init(counting source: @escaping @Sendable () -> Counts) {
        address = nil
        self.source = source
    }

    /// Everything counted so far.
    package var totals: Counts { state.withLock { $0.totals } }

    /// Why the last reading failed (nil: it did not).
    package var lastError: String? { state.withLock { $0.lastError } }

    /// Reads Litestream's page now (within 2 s) and adds what it counted since the last reading.
    /// Never fails: a page that does not come leaves the totals as they were, and says why in
    /// ``lastError``.
    package func refresh() -> EventLoopFuture<Void> {
        let loop = LitestreamControl.http.eventLoopGroup.any()
        guard let address else {
            // One process counting from its start: the same "start time" every time.
            if let source { add(Page(started: 0, counts: source())) }
            return loop.makeSucceededVoidFuture()
        }
        let request: HTTPClient.Request
        do {
            request = try HTTPClient.Request(url: "http://\(address)/metrics")
        } catch {
            state.withLock { $0.lastError = "\(error)" }
            return loop.makeSucceededVoidFuture()
        }
        return LitestreamControl.http.execute(request: request, deadline: .now() + .seconds(2)).map { [self] response in
            guard response.status == .ok, let body = response.body else {
                state.withLock { $0.lastError = "Litestream's /metrics answered \(response.status.code)" }
                return
            }
            add(Self.parse(String(buffer: body)))
        }.recover { [self] error in
            state.withLock { $0.lastError = "cannot read Litestream's /metrics on \(address): \(error)" }
        }
    }

    /// Adds what `page` counted since the last page: the difference while the same Litestream
    /// counts, everything on it once a new one does.
    package func add(_ page: Page) {
        state.withLock { state in
            let sameProcess = page.started != nil && page.started == state.last.started
            let before = sameProcess ? state.last.counts : Counts()
            for (operation, value) in page.counts.requests {
                state.totals.requests[operation, default: 0] += max(0, value - (before.requests[operation] ?? 0))
            }
            for (operation, value) in page.counts.bytes {
                state.totals.bytes[operation, default: 0] += max(0, value - (before.bytes[operation] ?? 0))
            }
            state.last = page
            state.lastError = nil
        }
    }

    /// The two counters and the process start time in a Prometheus text page, summed over
    /// replica types. Every other line is skipped (Litestream 0.5.17 also has a dozen series per
    /// database it ever replicated).
    package static func parse(_ text: String) -> Page {
        var page = Page()
        for line in text.split(separator: "\n") where line.first == "l" || line.first == "p" {
            if line.hasPrefix("process_start_time_seconds ") {
                page.started = Double(line.split(separator: " ").last ?? "")
                continue
            }
            let isRequests = line.hasPrefix("litestream_replica_operation_total{")
            guard isRequests || line.hasPrefix("litestream_replica_operation_bytes{"),
                  let operation = label("operation", in: line),
                  let value = line.split(separator: " ").last.flatMap({ Double($0) }) else { continue }
            if isRequests {
                page.counts.requests[operation, default: 0] += Int64(value)
            } else {
                page.counts.bytes[operation, default: 0] += Int64(value)
            }
        }
        return page
    }

    /// The value of label `name` in one sample line (`name{a="x",b="y"} 1`).
    private static func label(_ name: String, in line: Substring) -> String? {
        guard let start = line.range(of: name + "=\"") else { return nil }
        let rest = line[start.upperBound...]
        return rest.firstIndex(of: "\"").map { String(rest[..<$0]) }
    }
}
