import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import Varlink

/// The daemon and userstorectl on a machine with one CPU (`Tests/Helpers/one-cpu`: the CPU
/// files say one and the affinity is one CPU), where Swift's cooperative pool has one thread.
/// Nothing may wait for async work (the S3 and etcd clients behind the key store and the
/// replica) on that thread: a wait there, for work that needs it, never ends (the key store's
/// semaphore did, until it ran the work on threads of its own; it is async since 2026-12-08).
@Suite(.serialized) struct OneCPUTests {
    static let oneCPU = repositoryRoot + "/Tests/Helpers/one-cpu"

    /// Keys and replica on S3 (SeaweedFS): the daemon starts (it reads the key store's check
    /// record before serving), serves a durable write, and with its disk lost brings the user
    /// back from the bucket with its key; `verify --offline` reads the keys' bucket too. While the
    /// key store waited for its client on the cooperative pool, the start never ended.
    @Test func withKeysAndReplicaOnS3TheDaemonAndTheCLIWork() throws {
        let server = try SeaweedFS()
        let daemon = try EncryptionTests.onS3Daemon(server)
        try daemon.start(launcher: [Self.oneCPU])
        // What the daemon sees: CPU 0 only, and one CPU in the files the pool's width comes from.
        let status = try String(contentsOfFile: "/proc/\(daemon.pid)/status", encoding: .utf8)
        #expect(status.split(separator: "\n").contains("Cpus_allowed_list:\t0"), "\(status)")
        let possible = try String(contentsOfFile: "/proc/\(daemon.pid)/root/sys/devices/system/cpu/possible", encoding: .utf8)
        #expect(possible == "0\n")

        let row = "written on one CPU"
        _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": "alice", "sql": .string("INSERT INTO notes (title, body) VALUES ('n', '\(row)')"),
                                                                      "durable": true])
        #expect(daemon.stop() == 0)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start(launcher: [Self.oneCPU])
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes"])["rows"] == [[.string(row)]])
        #expect(daemon.stop() == 0)

        let verified = try run(["/usr/bin/timeout", "60", Self.oneCPU, userstorectlPath, "verify", "--all", "--offline", "--config", daemon.configPath, "--json"],
                               environment: server.environment)
        #expect(verified.status == 0, "\(verified.stdout) \(verified.stderr)")
    }
}
