import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// /metrics read by an independent parser (PyPI's prometheus-client), and `userstorectl top`.
@Suite(.serialized) struct MetricsTests {
    /// Scrapes the daemon's metrics socket with prometheus-client's text parser; returns
    /// `[sample name: [(labels, value)]]`, the HTTP status and content type.
    static let scraper = """
        import http.client, json, socket, sys
        from prometheus_client.parser import text_string_to_metric_families
        class UnixConnection(http.client.HTTPConnection):
            def __init__(self, path):
                super().__init__("localhost")
                self.unix_path = path
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(self.unix_path)
        connection = UnixConnection(sys.argv[1])
        connection.request("GET", sys.argv[2] if len(sys.argv) > 2 else "/metrics")
        response = connection.getresponse()
        text = response.read().decode()
        samples = {}
        if response.status == 200:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    samples.setdefault(sample.name, []).append([sample.labels, sample.value])
        print(json.dumps({"status": response.status, "type": response.getheader("Content-Type"), "samples": samples}))
        """

    struct Scrape {
        let status: Int
        let contentType: String
        let samples: [String: [(labels: [String: String], value: Double)]]

        /// The sample's value; NaN when the page lacks it, so that every comparison with a metric
        /// that disappeared fails instead of reading it as 0.
        func value(_ name: String, _ labels: [String: String] = [:]) -> Double {
            samples[name]?.first { sample in labels.allSatisfy { sample.labels[$0.key] == $0.value } }?.value ?? .nan
        }

        /// The value, 0 when absent: only for a "before" page, where a series made on first use
        /// (an error outcome) does not exist yet.
        func valueBefore(_ name: String, _ labels: [String: String] = [:]) -> Double {
            let found = value(name, labels)
            return found.isNaN ? 0 : found
        }
    }

    /// Durable writes show on the dashboard: every log object written (with Litestream, every
    /// sync asked of it) is counted and its duration observed
    /// (`userstore_replication_sync_duration_seconds`).
    @Test func replicationSyncsAreCountedAndTimed() throws {
        let metricsSocket = try TemporaryDirectory().path + "-m.sock"
        let replica = try TemporaryDirectory()
        let daemon = try ReplicationTests.daemon(replica: replica.path, extra: "metrics:\n  listen: unix:\(metricsSocket)")
        try daemon.start()
        defer { daemon.stop() }
        let client = try daemon.connect()
        for index in 0..<3 { try ReplicationTests.insert("durable \(index)", for: "ann", on: client, durable: true) }
        let scraped = try scrape(metricsSocket)
        let syncs = scraped.value("userstore_replication_syncs")
        #expect(syncs >= 3, "\(syncs) syncs for 3 durable writes")
        #expect(scraped.value("userstore_replication_sync_duration_seconds_count") >= 3)
        #expect(scraped.value("userstore_replication_sync_duration_seconds_sum") > 0)
    }

    /// The host log on the dashboard, in `Status` and in `userstorectl replication`: the objects
    /// it wrote, every request the daemon sent to the bucket (at least one PUT per object), the
    /// bytes put, nothing left unstored after durable writes.
    @Test func theHostLogIsOnTheDashboard() throws {
        let metricsSocket = try TemporaryDirectory().path + "-m.sock"
        let server = try SeaweedFS()
        try server.createBucket("dash")
        let daemon = try DaemonHarness(extraConfig: """
            replication:
              replica: "\(server.replicaURL(bucket: "dash", prefix: "r"))"
              engine: log
            metrics:
              listen: unix:\(metricsSocket)
            """)
        daemon.environment = server.environment
        try daemon.start()
        defer { daemon.stop() }
        let client = try daemon.connect()
        for index in 0..<3 { try ReplicationTests.insert("durable \(index)", for: "ann", on: client, durable: true) }
        let scraped = try scrape(metricsSocket)
        let written = scraped.value("userstore_replication_log_objects_written")
        // Each durable write waits for its own object (one writer); the store's creation and
        // migrations before them wrote a few more.
        #expect(written >= 3 && written < 20, "\(written) log objects for 3 durable writes to a new store")
        #expect(scraped.value("userstore_replication_bucket_requests_total", ["operation": "PUT"]) >= written)
        #expect(scraped.value("userstore_replication_bucket_bytes_total", ["operation": "PUT"]) > 0)
        #expect(scraped.value("userstore_replication_log_oldest_unstored_seconds") == 0)
        #expect(scraped.value("userstore_replication_log_pending_bytes") == 0)
        let status = try client.call("io.userstore.Admin.Status")["replication"]
        #expect(status?["engine"] == "log")
        #expect(status?["log"]?["objectsWritten"]?.integerValue.map(Double.init) == written)
        let shown = try run([userstorectlPath, "--socket", daemon.socketPath, "replication"])
        #expect(shown.status == 0 && shown.stdout.contains("host log: \(Int(written)) objects written"), "\(shown.stdout)\(shown.stderr)")
    }

    func scrape(_ socket: String, path: String = "/metrics") throws -> Scrape {
        let result = try run([testPython, "-c", Self.scraper, socket, path])
        #expect(result.status == 0, "\(result.stderr)")
        let json = try JSONParser().parse(result.stdout)
        var samples: [String: [(labels: [String: String], value: Double)]] = [:]
        for (name, list) in json["samples"]?.objectValue ?? [:] {
            samples[name] = (list.arrayValue ?? []).map { pair in
                let labels = (pair.arrayValue?.first?.objectValue ?? [:]).mapValues { $0.stringValue ?? "" }
                let value: Double
                switch pair.arrayValue?.last {
                case .integer(let integer)?: value = Double(integer)
                case .real(let real)?: value = real
                default: value = .nan
                }
                return (labels, value)
            }
        }
        return Scrape(status: Int(json["status"]?.integerValue ?? 0), contentType: json["type"]?.stringValue ?? "", samples: samples)
    }

    @Test func countersMoveWithTheRequestsMade() throws {
        let metricsSocket = try TemporaryDirectory().path + "-metrics.sock"
        let daemon = try DaemonHarness(extraConfig: "metrics:\n  listen: unix:\(metricsSocket)\n")
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Open", ["user": "metered"])
        let before = try scrape(metricsSocket)
        #expect(before.status == 200 && before.contentType.hasPrefix("text/plain; version=0.0.4"))

        for index in 0..<5 { _ = try client.call("io.userstore.Store.Query", ["user": "metered", "sql": "SELECT ?", "parameters": [.integer(Int64(index))]]) }
        for _ in 0..<2 { _ = try? client.call("io.userstore.Store.Query", ["user": "metered", "sql": "SELEC oops"]) }
        // Refused before it runs (a parameter Query does not define): counted all the same.
        _ = try? client.call("io.userstore.Store.Query", ["user": "metered", "sql": "SELECT 1", "durable": true])
        _ = try client.call("io.userstore.Store.Execute", ["user": "metered", "sql": "INSERT INTO notes (title) VALUES ('x')"])
        let transaction = try client.call("io.userstore.Store.Begin", ["user": "metered"])["transaction"]!
        _ = try client.call("io.userstore.Store.Commit", ["transaction": transaction])
        _ = try client.call("io.userstore.Store.Open", ["user": "brand-new"])
        _ = try client.call("io.userstore.Admin.Backup", ["user": "metered"])

        let after = try scrape(metricsSocket)
        func delta(_ name: String, _ labels: [String: String] = [:]) -> Double { after.value(name, labels) - before.valueBefore(name, labels) }
        let query = ["method": "io.userstore.Store.Query"]
        #expect(delta("userstore_requests_total", query.merging(["outcome": "ok", "interface": "io.userstore.Store"]) { $1 }) == 5)
        #expect(delta("userstore_requests_total", query.merging(["outcome": "SQLError"]) { $1 }) == 2)
        #expect(delta("userstore_requests_total", query.merging(["outcome": "InvalidParameter"]) { $1 }) == 1)
        #expect(delta("userstore_request_duration_seconds_count", query) == 8)
        #expect(delta("userstore_request_duration_seconds_sum", query) > 0)
        #expect(delta("userstore_requests_total", ["method": "io.userstore.Store.Execute", "outcome": "ok"]) == 1)
        #expect(delta("userstore_transactions_total", ["outcome": "committed"]) == 1)
        #expect(after.value("userstore_transactions_open") == 0)
        #expect(delta("userstore_store_opens_total", ["kind": "created"]) == 1)
        #expect(delta("userstore_migrations_total", ["outcome": "ok"]) == 1)
        #expect(delta("userstore_migration_duration_seconds_count") == 1)
        #expect(delta("userstore_backups_total") == 1 && delta("userstore_backup_bytes_total") > 0)
        #expect(after.value("userstore_open_stores") == 2 && after.value("userstore_connections") >= 1)
        #expect(after.value("userstore_stores", ["state": "current"]) == 2)
        #expect(after.value("process_resident_memory_bytes") > 1_000_000 && after.value("process_open_fds") > 3)
        #expect(after.value("process_start_time_seconds") > 1_700_000_000 && after.value("process_cpu_seconds_total") > 0)
        // No label carries a user.
        #expect(!after.samples.values.joined().contains { $0.labels.values.contains("metered") })
        #expect(try scrape(metricsSocket, path: "/other").status == 404)
        daemon.stop()
    }

    @Test func topShowsTheUserTheTestMadeHot() throws {
        let daemon = try DaemonHarness(extraConfig: "metrics:\n  listen: unix:\(try TemporaryDirectory().path)-m.sock\n")
        try daemon.start()
        let client = try daemon.connect()
        for user in ["cold1", "cold2", "hot"] { _ = try client.call("io.userstore.Store.Open", ["user": .string(user)]) }
        var hottest: JSONValue?
        var rounds = 0
        // Top reports complete seconds: keep the user hot until a report has it.
        while hottest == nil && rounds < 100 {
            rounds += 1
            for _ in 0..<100 { _ = try client.call("io.userstore.Store.Query", ["user": "hot", "sql": "SELECT 1"]) }
            _ = try client.call("io.userstore.Store.Query", ["user": "cold1", "sql": "SELECT 1"])
            let top = try run([userstorectlPath, "top", "--json", "--once", "--seconds", "2"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
            #expect(top.status == 0, "\(top.stderr)")
            let report = try JSONParser().parse(top.stdout)
            if let first = report["users"]?.arrayValue?.first, first["user"] == "hot" { hottest = report }
        }
        let report = try #require(hottest)
        let users = report["users"]?.arrayValue ?? []
        #expect((users.first?["calls"]?.integerValue ?? 0) > (users.dropFirst().first?["calls"]?.integerValue ?? 0))
        #expect(report["methods"]?.arrayValue?.contains { $0["method"] == "io.userstore.Store.Query" } == true)
        #expect(report["openStores"] == 3)
        // Human output too.
        let human = try run([userstorectlPath, "top", "--once"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(human.stdout.contains("METHOD") && human.stdout.contains("USER"))
        daemon.stop()
    }

    @Test func withoutMetricsTopSaysSoAndNothingListens() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let top = try run([userstorectlPath, "top", "--once"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(top.status == 1 && top.stderr.contains("MetricsDisabled"))
        daemon.stop()
    }
}
