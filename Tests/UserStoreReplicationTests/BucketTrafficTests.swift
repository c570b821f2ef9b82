import Testing
@testable import UserStoreReplication

/// Reading Litestream's Prometheus page (no Litestream here: the page's text as 0.5.17 writes
/// it; ObjectStoreTests reads a live one).
struct BucketTrafficTests {
    static func page(started: Double, puts: Int, putBytes: Int) -> String {
        """
        # HELP litestream_replica_operation_total The number of replica operations performed
        # TYPE litestream_replica_operation_total counter
        litestream_replica_operation_total{operation="PUT",replica_type="s3"} \(puts)
        litestream_replica_operation_total{operation="LIST",replica_type="s3"} 7
        litestream_replica_operation_total{operation="PUT",replica_type="file"} 2
        litestream_replica_operation_bytes{operation="PUT",replica_type="s3"} \(putBytes)
        litestream_db_size{db="/var/lib/userstore/stores/ab/cd/ann.sqlite"} 4096
        litestream_replica_operation_duration_seconds_count{operation="PUT",replica_type="s3"} 999
        process_start_time_seconds \(started)
        """
    }

    @Test func countsAreSummedOverReplicaTypesAndNothingElseIsTaken() {
        let page = BucketTraffic.parse(Self.page(started: 1.7e9, puts: 10, putBytes: 5000))
        #expect(page.started == 1.7e9)
        #expect(page.counts.requests == ["PUT": 12, "LIST": 7])
        #expect(page.counts.bytes == ["PUT": 5000])
    }

    @Test func totalsGoOnAcrossARestartAndNeverGoBack() {
        let traffic = BucketTraffic(address: "127.0.0.1:1")
        traffic.add(BucketTraffic.parse(Self.page(started: 100, puts: 10, putBytes: 1000)))
        traffic.add(BucketTraffic.parse(Self.page(started: 100, puts: 15, putBytes: 1500)))
        #expect(traffic.totals.requests["PUT"] == 17 && traffic.totals.bytes["PUT"] == 1500)
        // A new Litestream: its counts start again from zero and are added whole.
        traffic.add(BucketTraffic.parse(Self.page(started: 200, puts: 3, putBytes: 300)))
        #expect(traffic.totals.requests["PUT"] == 22 && traffic.totals.bytes["PUT"] == 1800)
        #expect(traffic.totals.requests["LIST"] == 14)
    }
}
