import Foundation

/// One object of the host log (or of a user's folded copy): a header an operator can read, then
/// the records as one zstd frame (docs/design.md, "The host log", has the layout):
///
/// ```
/// "USRLOG01"                  8 bytes, the format's magic and version
/// header length               4 bytes, big-endian
/// header                      JSON: who wrote it, its place in the log, the users it holds
/// body                        a zstd frame (with its content checksum) of the records
/// ```
///
/// The header names every user the object holds, so that a host taking a replica over learns
/// which objects of the unfolded tail it needs from their first bytes alone.
package struct LogSegment: Sendable, Equatable {
    package static let magic = Array("USRLOG01".utf8)

    /// What the header says.
    package struct Header: Codable, Sendable, Equatable {
        /// `log` (a batch of commits of every store of a host) or `fold` (one user's records).
        package var kind: String
        /// The host that wrote it, its data directory and its process (incarnation).
        package var host: String
        package var dataDirectory: String
        package var incarnation: String
        /// The writer lease's epoch it was written under (one host), or 0 (a cluster: each record
        /// carries its bucket's epoch).
        package var epoch: Int64
        /// Its place among the objects of its incarnation: 1, 2, 3, … (log objects).
        package var sequence: UInt64
        package var createdAt: String
        package var records: Int
        /// The users it holds records of, sorted.
        package var users: [String]
        /// The body's length, compressed and not.
        package var bodyBytes: Int
        package var recordBytes: Int
        /// Written by a cluster's host: each record carries its bucket and that bucket's epoch,
        /// and the fences are applied record by record (absent: one host).
        package var cluster: Bool? = nil
    }

    package var header: Header
    package var records: [LogRecord]

    /// Why an object is not a segment this version reads: `ReplicaDamaged` material.
    package struct Damaged: Error, CustomStringConvertible, Sendable {
        package let description: String
    }

    /// The object's bytes: the header with the records' users, counts and sizes filled in.
    package func encoded(level: Int32 = 3) -> [UInt8] {
        var body: [UInt8] = []
        body.reserveCapacity(records.reduce(0) { $0 + $1.encodedSize })
        for record in records { record.encode(into: &body) }
        let compressed = Zstd.compress(body, level: level)
        var header = self.header
        header.records = records.count
        header.users = Set(records.map(\.user)).sorted()
        header.bodyBytes = compressed.count
        header.recordBytes = body.count
        let json = (try? Self.encoder.encode(header)) ?? Data()
        var bytes = Self.magic
        LogRecord.append(UInt32(json.count), to: &bytes)
        bytes.append(contentsOf: json)
        bytes.append(contentsOf: compressed)
        return bytes
    }

    /// The header of an object whose first bytes are `prefix` (the whole object, or enough of its
    /// start); nil when `prefix` is too short to hold it (read more).
    package static func header(of prefix: [UInt8]) throws(Damaged) -> (header: Header, bodyOffset: Int)? {
        guard prefix.count >= 12 else { return nil }
        guard Array(prefix[0..<8]) == magic else { throw Damaged(description: "not a userstore log object (its magic is not USRLOG01)") }
        let length = Int(prefix[8..<12].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard length <= 64 << 20 else { throw Damaged(description: "a header of \(length) bytes") }
        guard prefix.count >= 12 + length else { return nil }
        guard let header = try? JSONDecoder().decode(Header.self, from: Data(prefix[12..<12 + length])) else {
            throw Damaged(description: "its header is not what userstored writes")
        }
        return (header, 12 + length)
    }

    /// The object `bytes`, whole: header and records, checked (magic, lengths, zstd's checksum).
    package static func decode(_ bytes: [UInt8]) throws(Damaged) -> LogSegment {
        guard let read = try header(of: bytes) else { throw Damaged(description: "truncated within its header") }
        return try decode(bytes, header: read)
    }

    /// ``decode(_:)`` for an object whose header the caller has read already (``header(of:)``).
    package static func decode(_ bytes: [UInt8], header read: (header: Header, bodyOffset: Int)) throws(Damaged) -> LogSegment {
        let (header, offset) = read
        guard bytes.count - offset == header.bodyBytes else {
            throw Damaged(description: "its body is \(bytes.count - offset) bytes, its header says \(header.bodyBytes)")
        }
        let body: [UInt8]
        do {
            body = try Zstd.decompress(Array(bytes[offset...]), limit: max(header.recordBytes, 0))
        } catch {
            throw Damaged(description: "its body does not decompress: \(error)")
        }
        guard body.count == header.recordBytes else { throw Damaged(description: "its records are \(body.count) bytes, its header says \(header.recordBytes)") }
        let records: [LogRecord]
        do {
            records = try LogRecord.decodeAll(body)
        } catch {
            throw Damaged(description: "its records cannot be read: \(error)")
        }
        guard records.count == header.records else { throw Damaged(description: "it holds \(records.count) records, its header says \(header.records)") }
        return LogSegment(header: header, records: records)
    }

    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }()
}
