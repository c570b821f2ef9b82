import Foundation
import UserStoreCore

/// What of the log counts once a host holds a new epoch of the writer lease: written by the new
/// holder before it reads the log (`fences/<epoch>.json`), it names, for every log folder
/// (`log/<data directory>/<incarnation>/`), the last sequence present then. A log object of an
/// older epoch counts only if a fence of every later epoch lists it: so what an old holder —
/// paused, cut off, unaware it lost the lease — uploads after the new one took over is never
/// applied, by this host, a later one or the fold (docs/design.md, "The host log").
///
/// In a cluster the epochs are the buckets': a host that owns buckets at epochs it has not
/// fenced writes one fence naming each of them (`buckets`), and a record of bucket B written
/// under epoch e counts only if every fence that names B at a later epoch lists its object.
package struct LogFence: Codable, Sendable, Equatable {
    /// The writer lease's epoch (one host); in a cluster the highest of `buckets`.
    package var epoch: Int64
    package var holder: String
    package var writtenAt: String
    /// For every log folder, the highest sequence present when the fence was written.
    package var through: [String: UInt64]
    /// In a cluster: the buckets fenced, each at the epoch its owner (the holder) took it at.
    package var buckets: [String: Int64]?
    /// In a cluster: the holder's data directory ID. Its own log is not fenced: a bucket's record
    /// rewritten with the same owner (draining, a move called off) gets a new epoch, and the
    /// owner's records under the old one, still uploading, must count; an earlier tenure's late
    /// records are voided by the fences of the owners in between.
    package var dataDirectory: String?

    /// The folder of the fences.
    package static let folder = "fences/"

    /// The key of the fence of `epoch` (20 digits: listed in order).
    package static func key(of epoch: Int64) -> String {
        let digits = String(max(epoch, 0))
        return folder + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".json"
    }

    /// The key of a cluster's fence written by the process `incarnation` of the data directory
    /// `dataDirectory`, its `number`th.
    package static func clusterKey(dataDirectory: String, incarnation: String, number: Int) -> String {
        let digits = String(number)
        return folder + "cluster/" + dataDirectory + "-" + incarnation + "-" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits + ".json"
    }

    /// Whether a record of `bucket` (nil: one host) written under `epoch`, in the log object
    /// `key` with `sequence`, counts under this fence.
    package func counts(_ key: String, bucket: UInt16?, epoch: Int64, sequence: UInt64) -> Bool {
        let fencedAt: Int64
        switch (bucket, buckets) {
        case (nil, nil): fencedAt = self.epoch
        case (let bucket?, let buckets?):
            guard let at = buckets[String(bucket)], Self.dataDirectory(of: key) != dataDirectory else { return true }
            fencedAt = at
        default: return true // a one-host fence says nothing of a cluster's records, and the other way round
        }
        return epoch >= fencedAt || (through[Self.logFolder(of: key)].map { sequence <= $0 } ?? false)
    }

    /// The folder of the log object `key` (`log/<data directory>/<incarnation>/`).
    static func logFolder(of key: String) -> String {
        key.lastIndex(of: "/").map { String(key[...$0]) } ?? ""
    }

    /// The data directory ID of the log object `key` (`log/<data directory>/<incarnation>/…`).
    static func dataDirectory(of key: String) -> String? {
        let parts = key.split(separator: "/")
        return parts.count >= 3 ? String(parts[1]) : nil
    }

    /// The sequence a log object's key spells (`…/<16 hex digits>.usl`).
    static func sequence(of key: String) -> UInt64? {
        guard let name = key.split(separator: "/").last, name.hasSuffix(".usl") else { return nil }
        return UInt64(name.dropLast(4), radix: 16)
    }

    /// Lists the log under `log` and writes the fence of `epoch` for it (in a cluster, of
    /// `buckets`, at `key`). Returns the fence and the log's keys as listed.
    package static func write(epoch: Int64, holder: String, storage: ReplicaStorage, log: String,
                              buckets: [String: Int64]? = nil, dataDirectory: String? = nil, key: String? = nil) async throws -> (fence: LogFence, listed: [String]) {
        var through: [String: UInt64] = [:]
        let listed = try await storage.keys(under: log)
        for key in listed {
            guard let sequence = sequence(of: key) else { continue }
            through[logFolder(of: key), default: 0] = max(through[logFolder(of: key)] ?? 0, sequence)
        }
        let fence = LogFence(epoch: epoch, holder: holder, writtenAt: RFC3339.format(Date()), through: through, buckets: buckets,
                             dataDirectory: dataDirectory)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        try await storage.put(key ?? Self.key(of: epoch), Array(try encoder.encode(fence)))
        return (fence, listed)
    }
}

/// Every fence of the log: a record counts only if each fence of a later epoch (of its bucket,
/// in a cluster) says so.
package struct LogFences: Sendable, Equatable {
    /// By key.
    package var fences: [String: LogFence] = [:]

    package init(_ fences: [String: LogFence] = [:]) {
        self.fences = fences
    }

    /// Whether the log object `key` (written under `epoch`, one host) counts: its records are
    /// all of one host's epoch.
    package func counts(_ key: String, epoch: Int64) -> Bool {
        counts(key, bucket: nil, epoch: epoch)
    }

    /// Whether a record of `bucket` under `epoch` in the log object `key` counts.
    package func counts(_ key: String, bucket: UInt16?, epoch: Int64) -> Bool {
        guard let sequence = LogFence.sequence(of: key) else { return false }
        return fences.values.allSatisfy { $0.counts(key, bucket: bucket, epoch: epoch, sequence: sequence) }
    }

    /// Whether `record`, in the log object `key` with `header`, counts.
    package func counts(_ key: String, header: LogSegment.Header, record: LogRecord) -> Bool {
        record.bucket == nil ? counts(key, epoch: header.epoch) : counts(key, bucket: record.bucket, epoch: record.epoch)
    }

    /// Every fence in the replica (those of `known` not read again: a fence never changes).
    /// A fence that cannot be read is damage, never skipped.
    package static func load(from storage: ReplicaStorage, known: LogFences = LogFences()) async throws -> LogFences {
        var fences: [String: LogFence] = [:]
        for key in try await storage.keys(under: LogFence.folder) where key.hasSuffix(".json") {
            if let fence = known.fences[key] {
                fences[key] = fence
                continue
            }
            guard let bytes = try await storage.get(key) else { continue }
            guard let fence = try? JSONDecoder().decode(LogFence.self, from: Data(bytes)) else {
                throw LogSegment.Damaged(description: "\(storage.describe(key)) is not a fence userstored wrote")
            }
            fences[key] = fence
        }
        return LogFences(fences)
    }

    /// The epoch each bucket was last fenced at (a cluster's fences).
    package var bucketEpochs: [UInt16: Int64] {
        var epochs: [UInt16: Int64] = [:]
        for fence in fences.values {
            for (bucket, epoch) in fence.buckets ?? [:] {
                guard let bucket = UInt16(bucket) else { continue }
                epochs[bucket] = max(epochs[bucket] ?? .min, epoch)
            }
        }
        return epochs
    }
}
