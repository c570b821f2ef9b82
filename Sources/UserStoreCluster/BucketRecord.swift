import Foundation

/// A bucket's owner record, `/us/v1/buckets/<bucket>` = `{"owner": HOST, "state": STATE}`.
/// Only the elected controller writes it, by compare-and-swap; the key's `mod_revision` is the
/// bucket's **epoch**: it changes with every change of owner or state, and replicas are fenced
/// by it (`<replica>/<bucket>/<user>/e<epoch>/`).
public struct BucketRecord: Codable, Equatable, Sendable {
    /// The owner host's name.
    public var owner: String
    /// `active` (the owner serves it) or `draining` (a move: the owner finishes and lets go).
    public var state: State

    public enum State: String, Codable, Sendable {
        case active, draining
    }

    public init(owner: String, state: State = .active) {
        self.owner = owner
        self.state = state
    }

    /// The record's key.
    public static func key(of bucket: Int) -> String { "/us/v1/buckets/\(bucket)" }

    /// The prefix every bucket record's key starts with.
    public static let prefix = "/us/v1/buckets/"

    /// The record as etcd holds it (sorted keys: equal records are equal text).
    public var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }

    /// Reads a record; nil when `bytes` is not one.
    public init?(json bytes: [UInt8]) {
        guard let record = try? JSONDecoder().decode(BucketRecord.self, from: Data(bytes)) else { return nil }
        self = record
    }

    /// The bucket number a record's key names, or nil.
    public static func bucket(ofKey key: String) -> Int? {
        guard key.hasPrefix(prefix), let bucket = Int(key.dropFirst(prefix.count)), (0..<Placement.bucketCount).contains(bucket) else { return nil }
        return bucket
    }
}
