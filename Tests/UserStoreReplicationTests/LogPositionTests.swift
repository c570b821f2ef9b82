import Foundation
import Testing
import UserStoreCore
import UserStoreReplication

/// The position kept beside a store (`.<user>.sqlite-log`): a pending one — written before a
/// base goes out — names its epoch but is never continued, and a daemon from before pending
/// positions cannot read it (so it ships a base rather than continue a stream whose base may
/// not be stored); a position written before pending ones existed still reads as it was.
struct LogPositionTests {
    /// What a daemon from before pending positions decodes: every field required but the stamp.
    struct OldPosition: Decodable {
        var stream: UInt64
        var epoch: Int64
        var txid: UInt64
        var frames: UInt32
    }

    @Test func aPendingPositionNamesItsEpochAndIsNeverContinued() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("position-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let store = folder.appendingPathComponent("ann.sqlite").path
        try LogPosition.shipping(stream: 42, epoch: 7, beside: store)
        let read = try #require(LogPosition.load(store))
        #expect(read.pending && read.epoch == 7 && read.stream == 42)
        let bytes = try #require(FileManager.default.contents(atPath: LogPosition.path(of: store)))
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(OldPosition.self, from: bytes) }
    }

    @Test func aPositionFromBeforePendingOnesReadsAsItWas() throws {
        let old = Data(#"{"stream":9,"epoch":3,"txid":12,"frames":4,"salt":[1,2]}"#.utf8)
        let read = try JSONDecoder().decode(LogPosition.self, from: old)
        #expect(!read.pending && read.txid == 12 && read.frames == 4 && read.salt == WALCapture.Salt(first: 1, second: 2))
        let again = try JSONDecoder().decode(LogPosition.self, from: try JSONEncoder().encode(read))
        #expect(again == read)
        #expect(try JSONDecoder().decode(OldPosition.self, from: try JSONEncoder().encode(read)).txid == 12)
    }
}
