import Foundation
import Prometheus

/// A Prometheus histogram of durations for one label set, recorded per thread
/// (``ThreadShards``) and rendered exactly as swift-prometheus renders its own
/// `DurationHistogram` (`DurationHistogramTests` compares the two byte for byte).
///
/// The request path records one of these per call. swift-prometheus' histogram takes one
/// lock for all threads, which the event loops contended for on every call; this one gives
/// each loop its own.
final class DurationHistogram: Sendable {
    /// Calls per bucket (not cumulative; the last one is above every bound), their sum, count.
    struct Counts: Sendable {
        var buckets: [Int]
        var nanoseconds: Int64 = 0
        var count = 0
    }

    /// The buckets' upper bounds, in nanoseconds, ascending.
    private let bounds: [Int64]
    private let renderedBounds: [String]
    /// `name="value",…` as the registry writes them (there is at least one label).
    private let labels: String
    private let counts: ThreadShards<Counts>

    init(labels: [(String, String)], buckets: [Duration]) {
        bounds = buckets.map { Int64($0.components.seconds) * 1_000_000_000 + $0.components.attoseconds / 1_000_000_000 }
        renderedBounds = buckets.map(\.bucketRepresentation)
        self.labels = labels.map { name, value in "\(name)=\"\(Self.escaped(value))\"" }.joined(separator: ",")
        let empty = Counts(buckets: [Int](repeating: 0, count: buckets.count + 1))
        counts = ThreadShards { empty }
    }

    /// Records one duration (a value equal to a bound counts in that bound's bucket, as in
    /// swift-prometheus).
    func record(nanoseconds: Int64) {
        var bucket = 0
        while bucket < bounds.count && bounds[bucket] < nanoseconds { bucket += 1 }
        counts.record { counts in
            counts.buckets[bucket] += 1
            counts.nanoseconds += nanoseconds
            counts.count += 1
        }
    }

    /// The merged counts of every thread.
    var total: Counts {
        counts.all.reduce(into: Counts(buckets: [Int](repeating: 0, count: bounds.count + 1))) { total, shard in
            for index in shard.buckets.indices { total.buckets[index] += shard.buckets[index] }
            total.nanoseconds += shard.nanoseconds
            total.count += shard.count
        }
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines of `name`.
    func emit(name: String, into text: inout String) {
        let total = self.total
        var cumulative = 0
        for (index, bound) in renderedBounds.enumerated() {
            cumulative += total.buckets[index]
            text += "\(name)_bucket{\(labels),le=\"\(bound)\"} \(cumulative)\n"
        }
        text += "\(name)_bucket{\(labels),le=\"+Inf\"} \(total.count)\n"
        text += "\(name)_sum{\(labels)} \(Duration.nanoseconds(total.nanoseconds).bucketRepresentation)\n"
        text += "\(name)_count{\(labels)} \(total.count)\n"
    }

    /// A label value escaped as the text format requires (backslash, double quote, line feed).
    private static func escaped(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
    }
}
