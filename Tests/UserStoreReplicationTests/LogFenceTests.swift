import Foundation
import Testing
@testable import UserStoreReplication

/// What a fence lets count (``LogFence``, ``LogFences``): one host's, by object; a cluster's,
/// record by record, by bucket and epoch — and never the fencing host's own records.
struct LogFenceTests {
    static let old = "log/dir-a/0000000001/"
    static let other = "log/dir-b/0000000001/"

    static func key(_ folder: String, _ sequence: UInt64) -> String {
        folder + String(repeating: "0", count: 16 - String(sequence, radix: 16).count) + String(sequence, radix: 16) + ".usl"
    }

    /// Host b took bucket 7 at epoch 20 when a's log stood at sequence 5.
    static let clusterFence = LogFence(epoch: 20, holder: "b", writtenAt: "2026-11-28T00:00:00Z", through: [old: 5],
                                       buckets: ["7": 20], dataDirectory: "dir-b")

    @Test func aClusterFenceVoidsTheOldOwnersLaterRecordsOfItsBucketsOnly() {
        let fences = LogFences([LogFence.clusterKey(dataDirectory: "dir-b", incarnation: "0000000001", number: 1): Self.clusterFence])
        // a's records of bucket 7 under epoch 10: those listed count, those uploaded after do not.
        #expect(fences.counts(Self.key(Self.old, 5), bucket: 7, epoch: 10))
        #expect(!fences.counts(Self.key(Self.old, 6), bucket: 7, epoch: 10))
        // Another bucket, or the bucket at the fence's epoch or later: untouched.
        #expect(fences.counts(Self.key(Self.old, 6), bucket: 8, epoch: 10))
        #expect(fences.counts(Self.key(Self.old, 6), bucket: 7, epoch: 20))
        // One host's records (no bucket) are not a cluster fence's business.
        #expect(fences.counts(Self.key(Self.old, 6), bucket: nil, epoch: 10))
    }

    /// The bucket's record rewritten with b still its owner (draining: a new epoch), b fences it
    /// again: b's own records under the old epoch, uploaded after, still count.
    @Test func aClusterFenceNeverVoidsItsOwnHostsRecords() {
        let fences = LogFences(["f": Self.clusterFence])
        #expect(fences.counts(Self.key(Self.other, 99), bucket: 7, epoch: 15))
        var foreign = Self.clusterFence
        foreign.dataDirectory = "dir-c"
        #expect(!LogFences(["f": foreign]).counts(Self.key(Self.other, 99), bucket: 7, epoch: 15))
    }

    @Test func aOneHostFenceJudgesWholeObjects() {
        let fence = LogFence(epoch: 20, holder: "b", writtenAt: "2026-11-28T00:00:00Z", through: [Self.old: 5])
        let fences = LogFences([LogFence.key(of: 20): fence])
        #expect(fences.counts(Self.key(Self.old, 5), epoch: 10))
        #expect(!fences.counts(Self.key(Self.old, 6), epoch: 10))
        #expect(fences.counts(Self.key(Self.old, 6), epoch: 20))
        // A cluster's record is judged by cluster fences only.
        #expect(fences.counts(Self.key(Self.old, 6), bucket: 7, epoch: 10))
    }

    @Test func theBucketEpochsFencedAreTheHighestOfEachBucket() {
        var later = Self.clusterFence
        later.buckets = ["7": 30, "9": 12]
        let fences = LogFences(["one": Self.clusterFence, "two": later])
        #expect(fences.bucketEpochs == [7: 30, 9: 12])
    }

    @Test func aFenceReadsBackTheSameAndAnOlderOneWithoutBucketsToo() throws {
        let encoded = try JSONEncoder().encode(Self.clusterFence)
        #expect(try JSONDecoder().decode(LogFence.self, from: encoded) == Self.clusterFence)
        let oneHost = Data(#"{"epoch":3,"holder":"a","writtenAt":"2026-11-27T00:00:00Z","through":{"log/d/1/":4}}"#.utf8)
        let read = try JSONDecoder().decode(LogFence.self, from: oneHost)
        #expect(read.buckets == nil && read.dataDirectory == nil && read.through == ["log/d/1/": 4])
    }
}
