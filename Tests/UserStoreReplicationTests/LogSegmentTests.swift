import Foundation
import Testing
import UserStoreConfiguration
import UserStoreCore
@testable import UserStoreReplication

/// The host log's object format (``LogSegment``, ``LogRecord``): what is written reads back the
/// same, the header alone is read from an object's first bytes, and any damage — a flipped byte
/// anywhere, a truncated object, another file — is named, never read as records.
struct LogSegmentTests {
    static func page(_ number: UInt32, _ fill: UInt8, size: Int = 4096) -> WALCapture.Page {
        WALCapture.Page(number: number, data: (0..<size).map { UInt8(truncatingIfNeeded: Int(fill) &+ $0 % 251) })
    }

    static let segment = LogSegment(
        header: .init(kind: "log", host: "host-a", dataDirectory: "d1", incarnation: "i1", epoch: 1_795_000_000, sequence: 42,
                      createdAt: "2026-11-27T12:00:00.000Z", records: 0, users: [], bodyBytes: 0, recordBytes: 0),
        records: [
            LogRecord(kind: .base, user: "ann", bucket: nil, epoch: 1_795_000_000, stream: 7, txid: 0, pageSize: 4096, databasePages: 2,
                      pages: [page(1, 1), page(2, 2)]),
            LogRecord(kind: .commit, user: "bob+1@x.y", bucket: 4095, epoch: -1, stream: .max, txid: 9, pageSize: 4096, databasePages: 3,
                      pages: [page(3, 3)]),
            LogRecord(kind: .erase, user: "ann", bucket: nil, epoch: 1_795_000_000, stream: 7, txid: 1, pageSize: 4096, databasePages: 0, pages: []),
            LogRecord(kind: .commit, user: "cy", bucket: 0, epoch: 5, stream: 1, txid: 1, pageSize: 65536, databasePages: 1,
                      pages: [page(1, 9, size: 65536)]),
        ])

    @Test func whatIsWrittenReadsBackTheSame() throws {
        let bytes = Self.segment.encoded()
        let read = try LogSegment.decode(bytes)
        #expect(read.records == Self.segment.records)
        #expect(read.header.users == ["ann", "bob+1@x.y", "cy"] && read.header.records == 4 && read.header.sequence == 42)
        // Compressed: the pages above repeat a pattern.
        #expect(bytes.count < read.header.recordBytes / 4, "\(bytes.count) bytes for \(read.header.recordBytes) of records")
    }

    @Test func theHeaderIsReadFromTheFirstBytesAlone() throws {
        let bytes = Self.segment.encoded()
        #expect(try LogSegment.header(of: Array(bytes.prefix(11))) == nil)
        let (header, offset) = try #require(try LogSegment.header(of: Array(bytes.prefix(4096))))
        #expect(header.users == ["ann", "bob+1@x.y", "cy"] && offset + header.bodyBytes == bytes.count)
    }

    @Test func everyDamageIsNamed() throws {
        let bytes = Self.segment.encoded()
        guard let (_, offset) = try LogSegment.header(of: bytes) else { Issue.record("no header"); return }
        // A flipped byte anywhere in the body, the header's JSON, or the magic.
        for position in [0, 5, 14, offset, offset + 1, (offset + bytes.count) / 2, bytes.count - 5, bytes.count - 1] {
            var damaged = bytes
            damaged[position] ^= 0x40
            #expect(throws: LogSegment.Damaged.self, "a flipped byte at \(position) of \(bytes.count) went unnoticed") { try LogSegment.decode(damaged) }
        }
        #expect(throws: LogSegment.Damaged.self) { try LogSegment.decode(Array(bytes.dropLast(7))) }
        #expect(throws: LogSegment.Damaged.self) { try LogSegment.decode(Array("SQLite format 3\0".utf8) + bytes) }
        #expect(throws: LogSegment.Damaged.self) { try LogSegment.decode([]) }
    }

    /// Before the replica's listing is in, a restore reads every log object: one whose body is
    /// damaged refuses the users its header names (ReplicaDamaged material), never another user
    /// (found by CI: a new user's first open, made before the listing was in, was refused).
    @Test func aDamagedObjectRefusesOnlyTheUsersItHolds() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("log-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let storage = try ReplicaStorage(ReplicationSettings(replica: "file://" + root))
        var bytes = Self.segment.encoded()
        guard let (_, offset) = try LogSegment.header(of: bytes) else { Issue.record("no header"); return }
        for index in offset..<bytes.count { bytes[index] ^= 0xFF }
        try await storage.put(LogRestorer.folder + "d1/i1/00000042.usl", bytes)
        let restorer = LogRestorer(storage: storage)
        #expect(try await restorer.holds("gus") == false)
        await #expect(throws: LogSegment.Damaged.self) { try await restorer.holds("ann") }
    }

    @Test func zstdRefusesMoreThanItsLimit() throws {
        let frame = Zstd.compress([UInt8](repeating: 7, count: 1 << 20))
        #expect(try Zstd.decompress(frame).count == 1 << 20)
        #expect(throws: Zstd.Failure.self) { try Zstd.decompress(frame, limit: 1000) }
        #expect(throws: Zstd.Failure.self) { try Zstd.decompress([1, 2, 3]) }
    }

    /// What a restore applies after a base: the furthest-reaching record each time. A process
    /// killed after its object with commit 3→4 was stored but before the one with 2→3 was leaves
    /// a hole that its successor fills with one record 0→4 (its WAL sent again from the stored
    /// position): that is a chain, not a gap (found by `make crash-s3`: ordered by txid alone, the
    /// stale 3→4 came first and the restore said ReplicaDamaged); without the 0→4 record it is a
    /// gap, named.
    @Test func aRecordSentAgainAfterACrashCoversTheHoleItLeft() throws {
        func commit(_ since: UInt64, _ txid: UInt64) -> LogRecord {
            LogRecord(kind: .commit, user: "ann", bucket: nil, epoch: 1, stream: 7, txid: txid, since: since, pageSize: 4096, databasePages: 1,
                      pages: [WALCapture.Page(number: 1, data: [UInt8](repeating: UInt8(txid), count: 4096))])
        }
        let chained = try LogRestorer.chain([commit(0, 1), commit(1, 2), commit(3, 4), commit(0, 4)], from: 0, user: "ann", stream: 7)
        #expect(chained.map { [$0.since, $0.txid] } == [[0, 4]])
        #expect(try LogRestorer.chain([commit(0, 1), commit(1, 2), commit(2, 3)], from: 0, user: "ann", stream: 7).map(\.txid) == [1, 2, 3])
        #expect(throws: LogSegment.Damaged.self) { try LogRestorer.chain([commit(0, 1), commit(1, 2), commit(3, 4)], from: 0, user: "ann", stream: 7) }
        // The fold's snapshot applies the same chain: page 1 as commit 4 left it.
        let base = LogRecord(kind: .base, user: "ann", bucket: nil, epoch: 1, stream: 7, txid: 0, since: 0, pageSize: 4096, databasePages: 1,
                             pages: [WALCapture.Page(number: 1, data: [UInt8](repeating: 0, count: 4096))])
        let snapshot = try #require(try LogFolder.snapshot(of: [base, commit(0, 1), commit(1, 2), commit(3, 4), commit(0, 4)]))
        #expect(snapshot.txid == 4 && snapshot.pages.first?.data.first == 4)
    }
}
