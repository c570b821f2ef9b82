import Foundation
import UserStoreCore

/// What of the log counts once a host holds a new epoch of the writer lease: written by the new
/// holder before it reads the log (`fences/<epoch>.json`), it names, for every log folder
/// (`log/<data directory>/<incarnation>/`), the last sequence present then. A log object of an
/// older epoch counts only if a fence of every later epoch lists it: so what an old holder —
/// paused, cut off, unaware it lost the lease — uploads after the new one took over is never
/// applied, by this host, a later one or the fold (docs/design.md, "The host log").
package struct LogFence: Codable, Sendable, Equatable {
    package var epoch: Int64
    package var holder: String
    package var writtenAt: String
    /// For every log folder, the highest sequence present when the fence was written.
    package var through: [String: UInt64]

    /// The folder of the fences.
    package static let folder = "fences/"

    /// The key of the fence of `epoch` (20 digits: listed in order).
    package static func key(of epoch: Int64) -> String {
        let digits = String(max(epoch, 0))
        return folder + String(repeating: "0", count: max(0, 20 - digits.count)) + digits + ".json"
    }

    /// Whether the log object `key`, written under `epoch` with `sequence`, counts under this fence.
    package func counts(_ key: String, epoch: Int64, sequence: UInt64) -> Bool {
        epoch >= self.epoch || (through[Self.logFolder(of: key)].map { sequence <= $0 } ?? false)
    }

    /// The folder of the log object `key` (`log/<data directory>/<incarnation>/`).
    static func logFolder(of key: String) -> String {
        key.lastIndex(of: "/").map { String(key[...$0]) } ?? ""
    }

    /// The sequence a log object's key spells (`…/<16 hex digits>.usl`).
    static func sequence(of key: String) -> UInt64? {
        guard let name = key.split(separator: "/").last, name.hasSuffix(".usl") else { return nil }
        return UInt64(name.dropLast(4), radix: 16)
    }

    /// Lists the log under `log` and writes the fence of `epoch` for it. Blocking.
    package static func write(epoch: Int64, holder: String, storage: ReplicaStorage, log: String) throws -> LogFence {
        var through: [String: UInt64] = [:]
        for key in try storage.keys(under: log) {
            guard let sequence = sequence(of: key) else { continue }
            through[logFolder(of: key), default: 0] = max(through[logFolder(of: key)] ?? 0, sequence)
        }
        let fence = LogFence(epoch: epoch, holder: holder, writtenAt: RFC3339.format(Date()), through: through)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        try storage.put(key(of: epoch), Array(try encoder.encode(fence)))
        return fence
    }
}

/// Every fence of the log: an object counts only if each fence of a later epoch says so.
package struct LogFences: Sendable, Equatable {
    package var fences: [LogFence] = []

    package init(_ fences: [LogFence] = []) {
        self.fences = fences
    }

    /// Whether the log object `key` (written under `epoch`) counts.
    package func counts(_ key: String, epoch: Int64) -> Bool {
        guard let sequence = LogFence.sequence(of: key) else { return false }
        return fences.allSatisfy { $0.counts(key, epoch: epoch, sequence: sequence) }
    }

    /// Every fence in the replica. Blocking; a fence that cannot be read is damage, never skipped.
    package static func load(from storage: ReplicaStorage) throws -> LogFences {
        var fences: [LogFence] = []
        for key in try storage.keys(under: LogFence.folder) where key.hasSuffix(".json") {
            guard let bytes = try storage.get(key) else { continue }
            guard let fence = try? JSONDecoder().decode(LogFence.self, from: Data(bytes)) else {
                throw LogSegment.Damaged(description: "\(storage.describe(key)) is not a fence userstored wrote")
            }
            fences.append(fence)
        }
        return LogFences(fences)
    }

    /// With `fence` added (or replacing the one of its epoch).
    package func adding(_ fence: LogFence) -> LogFences {
        LogFences(fences.filter { $0.epoch != fence.epoch } + [fence])
    }
}
