import Foundation
import Prometheus
import Synchronization
import Testing
@testable import UserStoreServer

/// The request path's metrics, recorded per thread: nothing lost across threads, and exported
/// exactly as swift-prometheus exported them before.
struct MetricShardsTests {
    @Test func everyRecordFromManyThreadsIsCounted() async throws {
        let shards = ThreadShards(count: 4) { 0 }
        let numbers = Mutex<Set<Int>>([])
        let threads = 6, records = 20_000
        let done = DispatchSemaphore(value: 0)
        for _ in 0..<threads {
            Thread {
                numbers.withLock { _ = $0.insert(ThreadNumber.current) }
                for _ in 0..<records { shards.record { $0 += 1 } }
                done.signal()
            }.start()
        }
        for _ in 0..<threads { done.wait() }
        // More threads than shards: some share one, and still no record is lost.
        #expect(shards.all.reduce(0, +) == threads * records)
        #expect(numbers.withLock { $0.count } == threads)
    }

    @Test func theHistogramRendersAsSwiftPrometheusDoes() throws {
        let buckets = DaemonMetrics.requestBuckets
        let name = "userstore_request_duration_seconds"
        let registry = PrometheusCollectorRegistry()
        let reference = registry.makeDurationHistogram(descriptor: MetricNameDescriptor(metricName: "userstore_request_duration", unitName: "seconds", helpText: ""), labels: [("method", "io.userstore.Store.Query")], buckets: buckets)
        let ours = DurationHistogram(labels: [("method", "io.userstore.Store.Query")], buckets: buckets)
        // Zero, a value on a bound (it counts in that bucket), just above one, above the top.
        let values: [Int64] = [0, 1, 25_000, 25_001, 99_999, 100_000, 1_234_567, 999_999_999, 1_000_000_000, 5_000_000_001, 7_000_000_000]
        let recorded = DispatchSemaphore(value: 0)
        for value in values {
            reference.record(.nanoseconds(value))
            Thread { ours.record(nanoseconds: value); recorded.signal() }.start() // each from a thread of its own
        }
        for _ in values { recorded.wait() }
        var expected = [UInt8]()
        registry.emit(into: &expected)
        let reportedLines = String(decoding: expected, as: UTF8.self).split(separator: "\n").filter { !$0.hasPrefix("#") }
        var text = ""
        ours.emit(name: name, into: &text)
        #expect(text.split(separator: "\n") == reportedLines)
        #expect(ours.total.count == values.count)
    }
}
