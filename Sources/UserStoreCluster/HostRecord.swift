import Foundation

/// A host's record, `/us/v1/hosts/<host>` = `{"address": "host:port"}`, bound to its lease:
/// where other daemons reach it. It exists exactly while the host's lease lives.
public struct HostRecord: Codable, Equatable, Sendable {
    public var address: String

    public init(address: String) { self.address = address }

    public var json: String {
        String(decoding: (try? JSONEncoder().encode(self)) ?? Data(), as: UTF8.self)
    }

    public init?(json bytes: [UInt8]) {
        guard let record = try? JSONDecoder().decode(HostRecord.self, from: Data(bytes)) else { return nil }
        self = record
    }
}
