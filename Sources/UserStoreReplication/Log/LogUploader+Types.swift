/// What an uploader is made with (how it batches, what its objects say of their origin) and
/// what it shows.
extension LogUploader {
    /// How the uploader batches.
    package struct Settings: Sendable {
        /// Objects being written at once.
        package var maxInFlight = 4
        /// While an object is being written, the next one begins once that one is stored or once
        /// its oldest record has waited this long (`replication.batchMilliseconds`); 0: at once,
        /// whenever a slot is free. Longer: fewer, larger objects — fewer PUTs — for a little
        /// latency under load.
        package var batchMilliseconds = 0
        /// An object closes at this many bytes of records (more wait for the next).
        package var maxObjectBytes = 16 << 20
        /// Records waiting to be written, past which ``append(_:)`` refuses more (the replica has
        /// been down long): the caller ships those stores whole once it is back.
        package var maxPendingBytes = 256 << 20

        package init() {}
    }

    /// What an object is written with, besides its records.
    package struct Origin: Sendable {
        package var host: String
        package var dataDirectory: String
        package var incarnation: String
        package var epoch: Int64
        /// The folder its objects go to (`log/…/`), ending in `/`.
        package var folder: String
        /// A cluster's host: each record carries its bucket's epoch (objects are written under 0).
        package var cluster: Bool

        package init(host: String, dataDirectory: String, incarnation: String, epoch: Int64, folder: String, cluster: Bool = false) {
            self.host = host
            self.dataDirectory = dataDirectory
            self.incarnation = incarnation
            self.epoch = epoch
            self.folder = folder
            self.cluster = cluster
        }
    }

    /// What `Status` and the metrics show of the uploader.
    package struct Snapshot: Sendable, Equatable {
        /// Records appended and stored since start.
        package var appended: UInt64
        package var stored: UInt64
        /// Objects written and bytes put since start.
        package var objects: Int
        package var bytes: Int
        /// Records waiting, and how long the oldest not yet stored has waited.
        package var pendingBytes: Int
        package var oldestUnstoredSeconds: Double
        /// The last failure writing an object, while objects fail.
        package var lastError: String?
    }
}
