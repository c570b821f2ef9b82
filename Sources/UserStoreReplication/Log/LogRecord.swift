import Foundation
import UserStoreCore

/// One entry of the host log: a store's commit (the pages it wrote), a base (every page of the
/// store: a full copy that starts a new stream), or an erase (the user is gone: nothing of it is
/// restored from before). Records are what the log's objects and the folded per-user objects
/// hold (docs/design.md, "The host log").
package struct LogRecord: Sendable, Equatable {
    package enum Kind: UInt8, Sendable {
        case commit = 1
        case base = 2
        case erase = 3
    }

    package var kind: Kind
    package var user: String
    /// With more than one host: the user's cluster bucket.
    package var bucket: UInt16?
    /// The epoch the store replicated under: the writer lease's (one host) or the bucket's.
    package var epoch: Int64
    /// The store's stream: a new one begins with every base; a restore applies, after the newest
    /// base, only the commits of its stream.
    package var stream: UInt64
    /// The position in the stream: the base's, then one more for each commit after it.
    package var txid: UInt64
    /// The position this record's pages change (the txid before its first commit): one record
    /// may carry several commits merged (what a WAL held after a crash), `since` to `txid`.
    package var since: UInt64
    package var pageSize: UInt32
    /// The database's size in pages after this record.
    package var databasePages: UInt32
    /// The pages written, once each, by ascending number.
    package var pages: [WALCapture.Page]

    package init(kind: Kind, user: String, bucket: UInt16?, epoch: Int64, stream: UInt64, txid: UInt64, since: UInt64? = nil,
                 pageSize: UInt32, databasePages: UInt32, pages: [WALCapture.Page]) {
        self.kind = kind
        self.user = user
        self.bucket = bucket
        self.epoch = epoch
        self.stream = stream
        self.txid = txid
        self.since = since ?? (txid > 0 ? txid - 1 : 0)
        self.pageSize = pageSize
        self.databasePages = databasePages
        self.pages = pages
    }

    /// Bytes it takes in an object's body.
    package var encodedSize: Int { 4 + 1 + 1 + user.utf8.count + 2 + 8 + 8 + 8 + 8 + 4 + 4 + 4 + pages.count * (4 + Int(pageSize)) }

    /// Appends the record (big-endian fields; its length first).
    package func encode(into bytes: inout [UInt8]) {
        bytes.reserveCapacity(bytes.count + encodedSize)
        Self.append(UInt32(encodedSize - 4), to: &bytes)
        bytes.append(kind.rawValue)
        bytes.append(UInt8(user.utf8.count))
        bytes.append(contentsOf: user.utf8)
        Self.append(bucket ?? UInt16.max, to: &bytes)
        Self.append(UInt64(bitPattern: epoch), to: &bytes)
        Self.append(stream, to: &bytes)
        Self.append(txid, to: &bytes)
        Self.append(since, to: &bytes)
        Self.append(pageSize, to: &bytes)
        Self.append(databasePages, to: &bytes)
        Self.append(UInt32(pages.count), to: &bytes)
        for page in pages {
            Self.append(page.number, to: &bytes)
            bytes.append(contentsOf: page.data)
        }
    }

    /// Why a body could not be read as records.
    package struct Malformed: Error, CustomStringConvertible, Sendable {
        package let description: String
    }

    /// Every record of `body`, in order.
    package static func decodeAll(_ body: [UInt8]) throws(Malformed) -> [LogRecord] {
        var records: [LogRecord] = []
        var reader = Reader(bytes: body)
        while !reader.atEnd { records.append(try decode(&reader)) }
        return records
    }

    private static func decode(_ reader: inout Reader) throws(Malformed) -> LogRecord {
        let length = Int(try reader.u32())
        let end = reader.offset + length
        guard end <= reader.bytes.count else { throw Malformed(description: "a record of \(length) bytes runs past the body's end") }
        guard let kind = Kind(rawValue: try reader.u8()) else { throw Malformed(description: "unknown record kind") }
        let userLength = Int(try reader.u8())
        guard let user = String(validating: try reader.take(userLength), as: UTF8.self) else { throw Malformed(description: "a user ID that is not UTF-8") }
        let bucket = try reader.u16()
        let epoch = Int64(bitPattern: try reader.u64())
        let stream = try reader.u64(), txid = try reader.u64(), since = try reader.u64()
        let pageSize = try reader.u32(), databasePages = try reader.u32(), count = Int(try reader.u32())
        guard pageSize >= 512, pageSize <= 65536 || kind == .erase else { throw Malformed(description: "page size \(pageSize)") }
        guard end - reader.offset == count * (4 + Int(pageSize)) else { throw Malformed(description: "\(count) pages of \(pageSize) bytes do not fill the record") }
        var pages: [WALCapture.Page] = []
        pages.reserveCapacity(count)
        for _ in 0..<count {
            let number = try reader.u32()
            pages.append(WALCapture.Page(number: number, data: Array(try reader.take(Int(pageSize)))))
        }
        return LogRecord(kind: kind, user: user, bucket: bucket == UInt16.max ? nil : bucket, epoch: epoch, stream: stream, txid: txid, since: since,
                         pageSize: pageSize, databasePages: databasePages, pages: pages)
    }

    static func append<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    /// Big-endian fields read off a byte array.
    struct Reader {
        let bytes: [UInt8]
        var offset = 0
        var atEnd: Bool { offset >= bytes.count }

        mutating func take(_ count: Int) throws(Malformed) -> ArraySlice<UInt8> {
            guard count >= 0, offset + count <= bytes.count else { throw Malformed(description: "truncated at byte \(offset)") }
            defer { offset += count }
            return bytes[offset..<offset + count]
        }

        mutating func u8() throws(Malformed) -> UInt8 { try take(1).first! }
        mutating func u16() throws(Malformed) -> UInt16 { UInt16(try integer(2)) }
        mutating func u32() throws(Malformed) -> UInt32 { UInt32(try integer(4)) }
        mutating func u64() throws(Malformed) -> UInt64 { try integer(8) }

        private mutating func integer(_ width: Int) throws(Malformed) -> UInt64 {
            try take(width).reduce(0) { $0 << 8 | UInt64($1) }
        }
    }
}
