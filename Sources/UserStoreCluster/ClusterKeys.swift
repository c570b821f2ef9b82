import Foundation

/// The etcd keys besides host and bucket records (docs/cluster.md).
public enum ClusterKeys {
    /// `/us/v1/moves/<bucket>` = `{"to": HOST}`: an operator's request to move a bucket
    /// (`userstorectl cluster move`); the controller carries it out and deletes it.
    public static let moves = "/us/v1/moves/"
    /// `/us/v1/released/<bucket>` = the draining epoch: the owner synced and closed every store
    /// of the bucket; the controller may give it to the move's target.
    public static let releases = "/us/v1/released/"
    /// `/us/v1/drains/<host>`, bound to that host's lease: move every bucket off it and give it
    /// none (`userstorectl cluster drain`); it ends when the host leaves.
    public static let drains = "/us/v1/drains/"
    /// `/us/v1/unfit/<host>` = why, bound to that host's lease: the host sees no replica of its
    /// own (its marker is missing or another one); the controller gives it no bucket, and leaves
    /// it those it owns (its stores keep what the replica may lack until the replica is back).
    public static let unfit = "/us/v1/unfit/"

    public static func move(_ bucket: Int) -> String { moves + "\(bucket)" }
    public static func released(_ bucket: Int) -> String { releases + "\(bucket)" }
    public static func drain(_ host: String) -> String { drains + host }
    public static func unfit(_ host: String) -> String { unfit + host }
}

/// A move request's value.
public struct MoveRequest: Codable, Equatable, Sendable {
    public var to: String

    public init(to: String) { self.to = to }

    public var json: String { String(decoding: (try? JSONEncoder().encode(self)) ?? Data(), as: UTF8.self) }

    public init?(json bytes: [UInt8]) {
        guard let request = try? JSONDecoder().decode(MoveRequest.self, from: Data(bytes)) else { return nil }
        self = request
    }
}
