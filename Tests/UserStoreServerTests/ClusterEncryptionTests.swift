import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import Varlink

extension ClusterDaemonTests {
    /// Encryption in a cluster (docs/encryption.md): the data keys in a bucket every host reaches
    /// (`keyStore: s3://…`), apart from the replica. a serves an encrypted user and dies
    /// (SIGKILL); b takes its buckets and restores the user from the replica with the user's key
    /// from the shared key store; b's copy is encrypted too.
    @Test func aSecondHostRestoresAnEncryptedUserWithTheSharedKeyStore() throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try Self.objectStore()
        try store.createBucket("keys")
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        func encrypted(_ host: String, port: Int) throws -> DaemonHarness {
            let daemon = try Self.daemon(host, port: port, etcd: etcd, store: store, extraConfig: """
                encryption:
                  keyFile: kek
                  keyStore: "\(store.replicaURL(bucket: "keys", prefix: "k"))"
                """)
            try (Data(key).base64EncodedString() + "\n").write(toFile: daemon.directory.path + "/kek", atomically: true, encoding: .utf8)
            return daemon
        }
        let a = try encrypted("a", port: 7131), b = try encrypted("b", port: 7132)
        try a.start()
        let toA = try a.connect()
        #expect(Self.eventually { Self.answer(toA, "user-0").0 == "here" }, "\(a.stderr.suffix(3000))")
        _ = try toA.call("io.userstore.Store.Execute", ["user": "user-0", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'sealed on a')", "durable": true])
        try b.start()
        let toB = try b.connect()
        #expect(Self.eventually { Self.answer(toB, "user-0").0 == "a" }, "\(b.stderr.suffix(3000))")

        a.stop(signal: SIGKILL)
        #expect(Self.eventually { Self.answer(toB, "user-0").0 == "here" }, "\(b.stderr.suffix(3000))")
        #expect(try toB.call("io.userstore.Store.Query", ["user": "user-0", "sql": "SELECT body FROM notes"])["rows"] == [["sealed on a"]])
        #expect(b.stderr.contains("event=store-restored"))
        #expect(b.stop() == 0)
        let copy = try run(["/usr/bin/find", b.dataDirectory, "-name", "user-0.sqlite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(FileManager.default.contents(atPath: copy)?.prefix(16) == Data("UserStore AES 1\u{0}".utf8), "\(copy)")
    }
}
