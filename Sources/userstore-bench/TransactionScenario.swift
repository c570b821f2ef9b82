import Foundation
import UserStoreCore

/// Scenario 6: interactive TPC-B-like transactions against pgbench's.
struct TransactionScenario: Scenario {
    let bench: Bench

    /// pgbench's TPC-B-like transaction over the socket — Begin, update an account, read it,
    /// update a teller and a branch, insert a history row, Commit, one call at a time — with
    /// eight connections, each on its own user (10,000 accounts, 10 tellers, 1 branch), against
    /// `pgbench -M prepared` with its built-in tpcb-like script at eight clients, same run.
    func run() async throws {
        log("6. TPC-B-like transactions")
        let migrations = env.root + "/tpcb-migrations", data = env.root + "/tpcb-data"
        try FileManager.default.createDirectory(atPath: migrations, withIntermediateDirectories: true)
        try """
            CREATE TABLE branches (bid INTEGER PRIMARY KEY, bbalance INTEGER NOT NULL, filler TEXT);
            CREATE TABLE tellers (tid INTEGER PRIMARY KEY, bid INTEGER NOT NULL, tbalance INTEGER NOT NULL, filler TEXT);
            CREATE TABLE accounts (aid INTEGER PRIMARY KEY, bid INTEGER NOT NULL, abalance INTEGER NOT NULL, filler TEXT);
            CREATE TABLE history (tid INTEGER, bid INTEGER, aid INTEGER, delta INTEGER, mtime TEXT, filler TEXT);
            """.write(toFile: migrations + "/0001_tpcb.sql", atomically: true, encoding: .utf8)
        let accounts = 10_000
        let fill = """
            INSERT INTO branches VALUES (1, 0, NULL);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) INSERT INTO tellers SELECT i, 1, 0, NULL FROM n;
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(accounts)) INSERT INTO accounts SELECT i, 1, 0, NULL FROM n;
            """
        let seed = try await env.makeSeed(data: env.root + "/tpcb-seed", migrations: try MigrationSet.load(directory: migrations), user: "seed", fill: fill)
        let names = users(8)
        try env.clone(seed, into: data, users: names)
        let (daemon, socket) = try env.startDaemon(name: "tpcb", data: data, migrations: migrations)
        defer { env.stop(daemon) }
        guard let load else { return }
        let (ours, daemonCPU) = withCPU(of: daemon.processIdentifier) { load.runTPCB(socket: socket, connections: 8, accounts: accounts, seconds: seconds) }
        record(Measurement(scenario: "6. TPC-B-like transaction", subject: "userstored, C client, 8 connections (a user each), 7 calls per transaction",
                           value: ours.throughput, unit: "tps", p50: ours.p50, p99: ours.p99,
                           note: "daemon CPU \(format(daemonCPU)) µs/transaction" + errors(ours.errors)))
        guard Postgres.available() else { return }
        let postgres = Postgres(directory: env.root + "/postgres-tpcb")
        postgres.start()
        defer { postgres.stop() }
        let (tps, latencies) = postgres.pgbench("", clients: 8, seconds: Int(seconds.rounded(.up)))
        record(Measurement(scenario: "6. TPC-B-like transaction", subject: "PostgreSQL 15 pgbench -M prepared (tpcb-like), 8 clients, scale 1",
                           value: tps, unit: "tps", p50: latencies.percentile(0.5), p99: latencies.percentile(0.99),
                           note: String(format: "userstored / PostgreSQL = %.2f×", ours.throughput / max(tps, 1))))
    }
}

extension LoadGenerator {
    /// The TPC-B-like transaction on each connection's own user (`u00000`…); a request is a transaction.
    func runTPCB(socket: String, connections: Int, accounts: Int, seconds: Double) -> Result {
        run(socket: socket, connections: connections, seconds: seconds, extra: ["--tpcb", "\(accounts)"],
            Workload(users: connections, userPerConnection: true))
    }
}
