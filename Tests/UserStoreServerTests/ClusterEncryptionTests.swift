import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import Varlink

extension ClusterDaemonTests {
    /// Encryption in a cluster (docs/encryption.md): the data keys where every host reaches
    /// them, apart from the replica — a bucket of their own (`keyStore: s3://…`) or the
    /// cluster's etcd (`keyStore: etcd`). a serves an encrypted user and dies (SIGKILL); b takes
    /// its buckets and restores the user from the replica with the user's key from the shared
    /// key store; b's copy is encrypted too. On etcd, the key-encryption key is then rotated with
    /// `keys rewrap` (refused while a host runs).
    @Test(arguments: ["s3", "etcd"])
    func aSecondHostRestoresAnEncryptedUserWithTheSharedKeyStore(keyStore: String) throws {
        let etcd = try EtcdCluster(size: 1)
        let store = try Self.objectStore()
        try store.createBucket("keys")
        let key = (0..<32).map { _ in UInt8.random(in: 0...255) }
        func encrypted(_ host: String, port: Int) throws -> DaemonHarness {
            let daemon = try Self.daemon(host, port: port, etcd: etcd, store: store, extraConfig: """
                encryption:
                  keyFile: kek
                  keyStore: "\(keyStore == "etcd" ? "etcd" : store.replicaURL(bucket: "keys", prefix: "k"))"
                """)
            try (Data(key).base64EncodedString() + "\n").write(toFile: daemon.directory.path + "/kek", atomically: true, encoding: .utf8)
            return daemon
        }
        let port = keyStore == "etcd" ? 7135 : 7131
        let a = try encrypted("a", port: port), b = try encrypted("b", port: port + 1)
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
        if keyStore == "etcd" {
            // The records are in etcd, none in the bucket.
            #expect(try store.keys("keys").filter { $0.hasPrefix("k/") }.isEmpty)
            // etcd's own JSON gateway (not the daemon's client): the keys under /us/v1/keys/.
            let script = """
                import base64, json, sys, urllib.request
                body = json.dumps({"key": base64.b64encode(b"/us/v1/keys/").decode(), "range_end": base64.b64encode(b"/us/v1/keys0").decode(), "keys_only": True}).encode()
                reply = json.load(urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v3/kv/range", data=body)))
                print("\\n".join(base64.b64decode(kv["key"]).decode() for kv in reply.get("kvs", [])))
                """
            let listed = try run(["/usr/bin/python3", "-c", script, etcd.endpoints[0]])
            #expect(listed.stdout.contains("/us/v1/keys/check") && listed.stdout.contains("/user-0"), "\(listed.stdout) \(listed.stderr)")

            // The key-encryption key's rotation on the cluster's etcd: refused while a host of
            // the cluster runs (b again; a's data directory is free), done with every host
            // stopped; verify --offline and b then read user-0 with the new key.
            let ctl = { (daemon: DaemonHarness, arguments: [String]) in
                try run([userstorectlPath] + arguments + ["--config", daemon.configPath], environment: store.environment)
            }
            let newKey = b.directory.path + "/kek.new"
            try (Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString() + "\n").write(toFile: newKey, atomically: true, encoding: .utf8)
            try b.start()
            let live = try b.connect()
            #expect(Self.eventually { Self.answer(live, "user-0").0 == "here" }, "\(b.stderr.suffix(3000))")
            let refused = try ctl(a, ["keys", "rewrap", "--new-key-file", newKey])
            #expect(refused.status == 3 && refused.stderr.contains("b is running"), "\(refused.stdout) \(refused.stderr)")
            #expect(b.stop() == 0)
            let rewrapped = try ctl(a, ["keys", "rewrap", "--new-key-file", newKey, "--json"])
            #expect(rewrapped.status == 0 && rewrapped.stdout.contains("\"rewrapped\": "), "\(rewrapped.stdout) \(rewrapped.stderr)")
            try FileManager.default.removeItem(atPath: b.directory.path + "/kek")
            try FileManager.default.copyItem(atPath: newKey, toPath: b.directory.path + "/kek")
            let verified = try ctl(b, ["verify", "--all", "--offline", "--json"])
            #expect(verified.status == 0, "\(verified.stdout) \(verified.stderr)")
            try b.start()
            let again = try b.connect()
            #expect(Self.eventually { Self.answer(again, "user-0").0 == "here" }, "\(b.stderr.suffix(3000))")
            #expect(try again.call("io.userstore.Store.Query", ["user": "user-0", "sql": "SELECT body FROM notes"])["rows"] == [["sealed on a"]])
            #expect(b.stop() == 0)
        }
    }
}
