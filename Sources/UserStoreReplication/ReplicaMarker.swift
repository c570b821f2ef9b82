import Foundation
import UserStoreCore

/// The marker at a replica's root (`userstore-replica.json`): the replica's identity. Written
/// once, when a daemon first uses an empty replica (or adopts one made before markers), and
/// never changed; a data directory records the ID of the replica it replicates to
/// (``ReplicaBinding``), so that an empty or different replica is never taken for its own
/// (docs/replication.md, "The replica's identity").
package struct ReplicaMarker: Codable, Sendable, Equatable {
    /// Its object name at the replica's root.
    package static let name = "userstore-replica.json"
    /// The layout this version of userstored writes.
    package static let currentLayout = 1

    /// A random ID (a UUID).
    package var id: String
    /// The layout of what is under the replica (1: `<ab>/<cd>/<user>/…`).
    package var layout: Int
    /// When and by which host the marker was written.
    package var createdAt: String
    package var createdBy: String
    /// True when it was written over a replica made before markers existed.
    package var adopted: Bool?
    /// The data directory that wrote it (``ReplicaBinding/dataDirectory``): one that crashed
    /// between writing the marker and recording its ID binds to it on its next start.
    package var dataDirectory: String?

    package init(createdBy host: String, dataDirectory: String, adopted: Bool) {
        id = UUID().uuidString.lowercased()
        layout = Self.currentLayout
        createdAt = RFC3339.format(Date())
        createdBy = host
        self.dataDirectory = dataDirectory
        self.adopted = adopted ? true : nil
    }

    package var json: Data { (try? Self.encoder.encode(self)) ?? Data() }

    package init?(json: Data) {
        guard let marker = try? JSONDecoder().decode(Self.self, from: json) else { return nil }
        self = marker
    }

    /// How an operator reads it: `replica 6f1c… (created by host-a at …)`.
    package var summary: String { "replica \(id) (created by \(createdBy) at \(createdAt)\(adopted == true ? ", adopted" : ""))" }

    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }()
}

/// What a data directory records about replication (`<dataDirectory>/replica.json`): its own
/// ID (the writer lease names it, so a restarted daemon knows the lease it finds is its own) and
/// the ID of the replica it replicates to, once it has used one.
package struct ReplicaBinding: Codable, Sendable, Equatable {
    /// This data directory's own random ID, made once.
    package var dataDirectory: String
    /// The ``ReplicaMarker/id`` of the replica this directory replicates to; nil until it first
    /// used one.
    package var replica: String?
    /// The replica's URL when it was bound (for an operator reading the file).
    package var replicaURL: String?
    /// The highest writer-lease epoch this data directory held: a new one is always above it,
    /// whatever the clock says and even if the lease object were lost.
    package var lastEpoch: Int64?
    /// How many times a daemon started on this data directory with the host log: each start's
    /// log objects go under the next number, so that a later start's sort after an earlier's.
    package var incarnations: Int?

    /// The file cannot be read or is not what userstored wrote.
    package struct Problem: Error, CustomStringConvertible {
        package let description: String
    }

    /// The binding kept in `layout`'s data directory, or a new one (with a new ID, not yet saved).
    package static func load(_ layout: StoreLayout) throws -> ReplicaBinding {
        guard let data = FileManager.default.contents(atPath: layout.replicaBindingPath) else {
            guard access(layout.replicaBindingPath, F_OK) != 0, errno == ENOENT else {
                throw Problem(description: "cannot read \(layout.replicaBindingPath): \(String(cString: strerror(errno)))")
            }
            return ReplicaBinding(dataDirectory: UUID().uuidString.lowercased())
        }
        guard let binding = try? JSONDecoder().decode(Self.self, from: data) else {
            throw Problem(description: "\(layout.replicaBindingPath) is not what userstored wrote (JSON with dataDirectory and replica); move it away to bind this data directory anew")
        }
        return binding
    }

    /// Writes it durably to `layout`'s data directory.
    package func save(_ layout: StoreLayout) throws {
        try DurableFile.write(String(decoding: (try? ReplicaMarker.encoder.encode(self)) ?? Data(), as: UTF8.self), to: layout.replicaBindingPath)
    }
}
