import Synchronization

/// What the daemon sent to the bucket — requests and bytes by S3 operation — as its own S3
/// client (the host log's) counted them since start. A `file://` replica counts nothing.
package final class BucketTraffic: Sendable {
    /// Requests and bytes by operation (`PUT`, `GET`, `DELETE`, `LIST`).
    package struct Counts: Equatable, Sendable {
        package var requests: [String: Int64] = [:]
        package var bytes: [String: Int64] = [:]

        package init() {}
    }

    /// The daemon's S3 client's counts since start.
    private let source: @Sendable () -> Counts

    /// Counts what `source` (the S3 client's counts since start) gives at each reading.
    package init(counting source: @escaping @Sendable () -> Counts) {
        self.source = source
    }

    /// Everything counted so far.
    package var totals: Counts { source() }
}
