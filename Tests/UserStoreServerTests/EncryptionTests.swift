import CChildProcess
import ClusterTestSupport
import DaemonTestSupport
import Foundation
import Testing
import UserStoreCore
import UserStoreReplication
import Varlink

/// Per-user encryption at rest (`encryption.*`, docs/encryption.md), against the real daemon: a
/// marker written to several users' stores is in no file under the data directory while every
/// read returns it; erasing a user makes a copy taken before unreadable; a wrong or missing
/// key-encryption key stops the daemon (exit 78); a missing data key, a tampered page and a
/// plaintext store are each handled by name.
@Suite(.serialized) struct EncryptionTests {
    /// A daemon with encryption: the key-encryption key in `kek` (base64) beside the
    /// configuration, the key store in `keys/` (outside the data directory).
    static func encryptedDaemon(extra: String = "") throws -> DaemonHarness {
        let daemon = try DaemonHarness()
        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon) + extra)
        return daemon
    }

    static func writeKey(in daemon: DaemonHarness, bytes: [UInt8] = (0..<32).map { _ in UInt8.random(in: 0...255) }) throws {
        try (Data(bytes).base64EncodedString() + "\n").write(toFile: daemon.directory.path + "/kek", atomically: true, encoding: .utf8)
    }

    /// The configuration's encryption section; the key store's folder is made (the daemon
    /// never makes it: a missing one is an unmounted key store).
    static func encryptionConfig(_ daemon: DaemonHarness) -> String {
        try? FileManager.default.createDirectory(atPath: daemon.directory.path + "/keys", withIntermediateDirectories: true)
        return "encryption:\n  keyFile: kek\n  keyStore: file://\(daemon.directory.path)/keys\n"
    }

    /// The encryption and replication sections of a daemon with its keys and its replica on
    /// `server`: the key store in bucket `keys` (prefix `k`) unless `keyStore` names another,
    /// the replica in bucket `data` (prefix `r`).
    static func onS3Config(_ server: SeaweedFS, keyFile: String = "kek", keyStore: String? = nil) -> String {
        "encryption:\n  keyFile: \(keyFile)\n  keyStore: \"\(keyStore ?? server.replicaURL(bucket: "keys", prefix: "k"))\"\n"
            + "replication:\n  replica: \"\(server.replicaURL(bucket: "data", prefix: "r"))\"\n  litestream: \(litestreamPath)\n"
    }

    /// A daemon, not started, with its keys and its replica on `server`
    /// (``onS3Config(_:keyFile:keyStore:)``, both buckets made) and its key-encryption key in
    /// `kek`.
    static func onS3Daemon(_ server: SeaweedFS) throws -> DaemonHarness {
        try server.createBucket("data")
        try server.createBucket("keys")
        let daemon = try DaemonHarness()
        daemon.environment = server.environment
        try writeKey(in: daemon)
        try daemon.writeConfig(extra: onS3Config(server))
        return daemon
    }

    /// The files under `directory` whose bytes hold `marker`.
    static func files(holding marker: String, under directory: String) -> [String] {
        let needle = Data(marker.utf8)
        return (FileManager.default.enumerator(atPath: directory)?.compactMap { $0 as? String } ?? []).filter { name in
            guard let bytes = FileManager.default.contents(atPath: directory + "/" + name) else { return false }
            return bytes.range(of: needle) != nil
        }
    }

    static func storePath(_ daemon: DaemonHarness, _ user: String) -> String? {
        (FileManager.default.enumerator(atPath: daemon.dataDirectory + "/stores")?.compactMap { $0 as? String } ?? [])
            .first { ($0 as NSString).lastPathComponent == user + ".sqlite" }.map { daemon.dataDirectory + "/stores/" + $0 }
    }

    /// Rows, a unique index (tags.name), a transaction larger than the page cache, a backup
    /// taken before a migration, a daemon restart (every store closed and reopened): the marker
    /// reads back every time and is in no file under the data directory.
    @Test func aMarkerIsInNoFileUnderTheDataDirectoryWhileEveryReadReturnsIt() throws {
        let daemon = try Self.encryptedDaemon(extra: "migrations:\n  backupBeforeMigrating: true\n")
        try daemon.start()
        let marker = "marker-\(UUID().uuidString)"
        let users = ["alice", "bob", "carol"]
        let client = try daemon.connect()
        for user in users {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string("INSERT INTO notes (title, body) VALUES ('n', '\(marker)')")])
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string("INSERT INTO tags (name) VALUES ('\(marker)')")])
        }
        // ~6 MB in one transaction: spilled to the WAL before it commits.
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": .string(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) INSERT INTO notes (title, body) SELECT 'bulk', '\(marker)' || i || printf('%.2000c', 'x') FROM n")])
        _ = try client.call("io.userstore.Admin.Backup", ["user": "bob"])
        // A migration with a backup before it: bob's and carol's stores are copied first.
        try daemon.addMigration("0007_x.sql", "ALTER TABLE notes ADD COLUMN x INTEGER;\nUPDATE notes SET x = 0;")
        _ = try client.call("io.userstore.Admin.Reload")
        for user in users { _ = try client.call("io.userstore.Store.Open", ["user": .string(user)]) }
        let whileServing = Self.files(holding: marker, under: daemon.dataDirectory)
        #expect(daemon.stop() == 0)
        let afterStop = Self.files(holding: marker, under: daemon.dataDirectory)

        try daemon.start()
        let again = try daemon.connect()
        for user in users {
            let rows = try again.call("io.userstore.Store.Query", ["user": .string(user), "sql": .string("SELECT count(*) FROM notes WHERE body LIKE '\(marker)%'")])["rows"]
            #expect(rows == [[user == "alice" ? 3001 : 1]], "\(user): \(String(describing: rows))")
            let tag = try again.call("io.userstore.Store.Query", ["user": .string(user), "sql": .string("SELECT name FROM tags WHERE name = '\(marker)'")])["rows"]
            #expect(tag == [[.string(marker)]], "\(user): \(String(describing: tag))")
        }
        let backups = (FileManager.default.enumerator(atPath: daemon.dataDirectory)?.compactMap { $0 as? String } ?? []).filter { $0.hasPrefix("backups/") && $0.hasSuffix(".sqlite") }
        #expect(backups.count >= 3, "\(backups)")
        #expect(whileServing.isEmpty, "the marker is in \(whileServing)")
        #expect(afterStop.isEmpty, "the marker is in \(afterStop)")
        // An export is plaintext (data portability).
        var exported = Data()
        try again.stream("io.userstore.Admin.ExportStore", ["user": "carol"]) { reply in
            if case .string(let chunk)? = reply["chunk"], let bytes = Data(base64Encoded: chunk) { exported.append(bytes) }
        }
        #expect(exported.range(of: Data(marker.utf8)) != nil, "the export (\(exported.count) bytes) does not hold the marker")
        #expect(daemon.stop() == 0)
    }

    /// DeleteStore destroys the user's data key first: the store's file and backup as they were
    /// before (a copy of the disk), put back, can no longer be read — `StoreErased`, never rows.
    @Test func erasingAUserLeavesACopyTakenBeforeUnreadable() throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'secret')"])
        _ = try client.call("io.userstore.Store.Execute", ["user": "bob", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'kept')"])
        #expect(daemon.stop() == 0)
        let path = try #require(Self.storePath(daemon, "alice"))
        let copy = try #require(FileManager.default.contents(atPath: path))

        try daemon.start()
        let again = try daemon.connect()
        _ = try again.call("io.userstore.Admin.DeleteStore", ["user": "alice"])
        #expect(daemon.stop() == 0)
        // The old disk's copy, back in place.
        try copy.write(to: URL(fileURLWithPath: path))
        try daemon.start()
        let third = try daemon.connect()
        let refused = varlinkError { _ = try third.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes"]) }
        #expect(refused?.name == "io.userstore.Store.StoreErased" && refused?.parameters["user"] == "alice", "\(String(describing: refused))")
        #expect(try third.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT body FROM notes"])["rows"] == [["kept"]])
        #expect(daemon.stop() == 0)
    }

    /// A store whose key record is gone is `StoreKeyMissing` (not served, not made anew); one
    /// whose page was changed on disk is `StoreDamaged`; other users are served.
    @Test func aMissingDataKeyAndATamperedPageAreRefusedByName() throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        let client = try daemon.connect()
        for user in ["alice", "bob", "carol"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) INSERT INTO notes (title, body) SELECT 'n', printf('%.200c', 'x') FROM n"])
        }
        #expect(daemon.stop() == 0)
        let keys = daemon.directory.path + "/keys"
        let aliceKey = try #require(FileManager.default.enumerator(atPath: keys)?.compactMap { $0 as? String }.first { $0.hasSuffix("/alice") })
        try FileManager.default.removeItem(atPath: keys + "/" + aliceKey)
        let bobPath = try #require(Self.storePath(daemon, "bob"))
        // One bit of every page but the first two (whichever holds the rows read below).
        var bob = try #require(FileManager.default.contents(atPath: bobPath))
        for page in stride(from: 2 * 4096, to: bob.count, by: 4096) { bob[page + 100] ^= 0x01 }
        try bob.write(to: URL(fileURLWithPath: bobPath))

        try daemon.start()
        let again = try daemon.connect()
        let missing = varlinkError { _ = try again.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"]) }
        #expect(missing?.name == "io.userstore.Store.StoreKeyMissing" && missing?.parameters["user"] == "alice", "\(String(describing: missing))")
        let tampered = varlinkError { _ = try again.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT count(*), sum(length(body)) FROM notes"]) }
        #expect(tampered?.name == "io.userstore.Store.StoreDamaged" && tampered?.parameters["user"] == "bob", "\(String(describing: tampered)) \(daemon.stderr.suffix(1500))")
        #expect(try again.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT count(*) FROM notes"])["rows"] == [[300]])
        #expect(daemon.stop() == 0)
    }

    /// A store written before encryption was turned on is encrypted on its next open, its rows kept.
    @Test func aPlaintextStoreIsEncryptedOnItsNextOpen() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'before-encryption')"])
        #expect(daemon.stop() == 0)
        #expect(Self.files(holding: "before-encryption", under: daemon.dataDirectory).contains { $0.hasSuffix("alice.sqlite") })

        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon))
        try daemon.start()
        let again = try daemon.connect()
        // Status counts it plaintext until it is opened (ListStores waits for the start-up scan).
        try again.stream("io.userstore.Admin.ListStores") { _ in }
        let before = try again.call("io.userstore.Admin.Status")
        #expect(before["plaintextStores"] == 1 && before["encryptedStores"] == 0, "\(before)")
        #expect(try again.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes"])["rows"] == [["before-encryption"]])
        let after = try again.call("io.userstore.Admin.Status")
        #expect(after["plaintextStores"] == 0 && after["encryptedStores"] == 1, "\(after)")
        _ = try again.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'after-encryption')"])
        #expect(daemon.stop() == 0)
        let path = try #require(Self.storePath(daemon, "alice"))
        #expect(FileManager.default.contents(atPath: path)?.prefix(16) == Data("UserStore AES 1\u{0}".utf8))
        let holding = Self.files(holding: "before-encryption", under: daemon.dataDirectory) + Self.files(holding: "after-encryption", under: daemon.dataDirectory)
        #expect(holding.isEmpty, "\(holding)")
    }

    /// The daemon's exit status once it ends on its own, waiting at most a minute (a daemon that
    /// starts when it should not is stopped, and nil returned).
    func exitStatus(_ daemon: DaemonHarness) -> Int32? {
        guard us_wait_for_exit(daemon.pid, 60_000) == 1 else {
            daemon.stop()
            return nil
        }
        return daemon.waitForExit()
    }

    /// A wrong key-encryption key (not the key store's), one of the wrong size, and a missing
    /// key file stop the daemon at start: exit 78, the error named on stderr; no store is opened.
    @Test func aWrongOrMissingKeyEncryptionKeyStopsTheDaemon() throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title) VALUES ('n')"])
        #expect(daemon.stop() == 0)

        try Self.writeKey(in: daemon) // another key
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyEncryptionKeyWrong"), "\(daemon.stderr)")

        try Self.writeKey(in: daemon, bytes: [UInt8](repeating: 7, count: 16))
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyEncryptionKeyMissing"), "\(daemon.stderr)")

        try FileManager.default.removeItem(atPath: daemon.directory.path + "/kek")
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("encryption.keyFile"), "\(daemon.stderr)")

        // The key store's folder gone (not mounted): never a new key store in its place.
        try Self.writeKey(in: daemon)
        try FileManager.default.moveItem(atPath: daemon.directory.path + "/keys", toPath: daemon.directory.path + "/keys.away")
        try FileManager.default.removeItem(atPath: daemon.directory.path + "/keys.away")
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyStoreUnavailable"), "\(daemon.stderr)")
        #expect(!FileManager.default.fileExists(atPath: daemon.directory.path + "/keys"))
    }

    /// The objects under `replica` that hold `marker`: the log's objects and the folds decoded
    /// (their pages are zstd-compressed), any other object as it is.
    static func objects(holding marker: String, under replica: String) -> [String] {
        let needle = Array(marker.utf8)
        func holds(_ bytes: [UInt8]) -> Bool { Data(bytes).range(of: Data(needle)) != nil }
        return (FileManager.default.enumerator(atPath: replica)?.compactMap { $0 as? String } ?? []).filter { name in
            guard let data = FileManager.default.contents(atPath: replica + "/" + name) else { return false }
            guard let segment = try? LogSegment.decode(Array(data)) else { return holds(Array(data)) }
            return segment.records.contains { record in record.pages.contains { holds($0.data) } }
        }
    }

    /// Replicated (the daemon's own log): no object in the replica holds a marker the stores
    /// hold (pages decoded); the disk lost, the store comes back from the replica with its key;
    /// then a copy of the replica taken before the user was erased, read with the key store as
    /// it is now, gives the user back to nobody — `StoreErased` — while another user is served.
    @Test func theReplicaHoldsOnlyCiphertextRestoresWithTheKeyAndForgetsAnErasedUser() throws {
        let replica = try TemporaryDirectory(), copy = try TemporaryDirectory()
        let daemon = try DaemonHarness()
        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon) + "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestreamPath)\n")
        try daemon.start()
        let marker = "marker-\(UUID().uuidString)"
        let client = try daemon.connect()
        for user in ["alice", "bob"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string("INSERT INTO notes (title, body) VALUES ('n', '\(marker)')"), "durable": true])
        }
        let shipped = Self.objects(holding: marker, under: replica.path)
        #expect(shipped.isEmpty, "the marker is in \(shipped)")

        // The disk lost: alice comes back from the replica, with her key.
        daemon.stop(signal: SIGKILL)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let again = try daemon.connect()
        #expect(try again.call("io.userstore.Store.Query", ["user": "alice", "sql": .string("SELECT count(*) FROM notes WHERE body = '\(marker)'")])["rows"] == [[1]])
        // A copy of the replica (a bucket backup), then alice erased.
        #expect(try run(["/bin/cp", "-a", replica.path + "/.", copy.path]).status == 0)
        _ = try again.call("io.userstore.Admin.DeleteStore", ["user": "alice"])
        #expect(daemon.stop() == 0)

        // The old copy of the replica back in place, and the disk lost again.
        try FileManager.default.removeItem(atPath: replica.path)
        #expect(try run(["/bin/cp", "-a", copy.path, replica.path]).status == 0)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        let third = try daemon.connect()
        let erased = varlinkError { _ = try third.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes"]) }
        #expect(erased?.name == "io.userstore.Store.StoreErased" && erased?.parameters["user"] == "alice", "\(String(describing: erased))")
        #expect(try third.call("io.userstore.Store.Query", ["user": "bob", "sql": .string("SELECT count(*) FROM notes WHERE body = '\(marker)'")])["rows"] == [[1]])
        #expect(daemon.stop() == 0)

        // Without a daemon (restore --offline): bob's copy written encrypted, checked with his
        // key; alice's refused by name.
        let offline = { (user: String) in
            try run([userstorectlPath, "restore", user, "--from-replica", "--offline", "--config", daemon.configPath, "--to", copy.path + "/\(user).sqlite"])
        }
        let bob = try offline("bob")
        #expect(bob.status == 0, "\(bob.stdout) \(bob.stderr)")
        #expect(FileManager.default.contents(atPath: copy.path + "/bob.sqlite")?.prefix(16) == Data("UserStore AES 1\u{0}".utf8))
        let alice = try offline("alice")
        #expect(alice.status == 1 && alice.stderr.contains("StoreErased"), "\(alice.stdout) \(alice.stderr)")
    }

    /// `userstorectl keys rotate`: the store reads back under a new key, its key record holds
    /// only the new key, and the file as it was before (a copy) no longer reads — `StoreDamaged`.
    /// A rotation cut short after the rewrite (both keys in the key store, the file under the
    /// next) is finished by the next open. Without encryption: `InvalidRequest`.
    @Test func rotatingAStoresKeyLeavesOldCopiesUnreadable() async throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        let client = try daemon.connect()
        for user in ["alice", "bob", "carol"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) INSERT INTO notes (title, body) SELECT 'n', printf('%.200c', 'x') FROM n"])
        }
        #expect(daemon.stop() == 0)
        let keys = daemon.directory.path + "/keys"
        func record(_ user: String) throws -> Data {
            let name = try #require(FileManager.default.enumerator(atPath: keys)?.compactMap { $0 as? String }.first { $0.hasSuffix("/" + user) })
            return try #require(FileManager.default.contents(atPath: keys + "/" + name))
        }
        let alicePath = try #require(Self.storePath(daemon, "alice")), bobPath = try #require(Self.storePath(daemon, "bob"))
        let before = try #require(FileManager.default.contents(atPath: alicePath)), recordBefore = try record("alice")

        try daemon.start()
        let rotated = try run([userstorectlPath, "keys", "rotate", "alice", "--json"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(rotated.status == 0, "\(rotated.stderr)")
        let reply = try JSONParser().parse(rotated.stdout)
        #expect((reply["pages"]?.integerValue ?? 0) > 10, "\(rotated.stdout)")
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"])["rows"] == [[300]])
        #expect(daemon.stop() == 0)
        let recordAfter = try record("alice")
        #expect(recordAfter != recordBefore && recordAfter.count == recordBefore.count, "\(recordBefore.count) → \(recordAfter.count) bytes")

        // Bob's rotation cut short once his store was rewritten under the next key.
        let keyring = try StoreKeyring(keyFile: daemon.directory.path + "/kek", store: FolderKeyStore(root: keys))
        let (current, next) = try await keyring.beginRotation(of: UserID("bob"))
        _ = try StoreEncryptor.reencrypt(bobPath, from: current, to: next)
        #expect(try record("bob").count == 2 * recordBefore.count)
        // Carol's too: then rotated again before anything opens her store.
        let carolPath = try #require(Self.storePath(daemon, "carol"))
        let (carolCurrent, carolNext) = try await keyring.beginRotation(of: UserID("carol"))
        _ = try StoreEncryptor.reencrypt(carolPath, from: carolCurrent, to: carolNext)
        // Alice's file as it was before her rotation.
        try before.write(to: URL(fileURLWithPath: alicePath))

        try daemon.start()
        let again = try daemon.connect()
        #expect(try again.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT count(*) FROM notes"])["rows"] == [[300]])
        let old = varlinkError { _ = try again.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"]) }
        #expect(old?.name == "io.userstore.Store.StoreDamaged", "\(String(describing: old))")
        let carol = try run([userstorectlPath, "keys", "rotate", "carol"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(carol.status == 0, "\(carol.stdout) \(carol.stderr)")
        #expect(try again.call("io.userstore.Store.Query", ["user": "carol", "sql": "SELECT count(*) FROM notes"])["rows"] == [[300]])
        #expect(daemon.stop() == 0)
        #expect(try record("bob").count == recordBefore.count, "bob's rotation was not finished")
        #expect(try record("carol").count == recordBefore.count, "carol's rotation was not finished")

        let plain = try DaemonHarness()
        try plain.start()
        _ = try plain.connect().call("io.userstore.Store.Open", ["user": "alice"])
        let refused = varlinkError { _ = try plain.connect().call("io.userstore.Admin.RotateStoreKey", ["user": "alice"]) }
        #expect(refused?.name == "io.userstore.Store.InvalidRequest", "\(String(describing: refused))")
        #expect(plain.stop() == 0)
    }

    /// `userstorectl keys rewrap` with the daemon stopped: every data key under a new
    /// key-encryption key; the daemon refuses the old key afterwards and reads every store with
    /// the new one. While it runs the daemon cannot start (it holds the lock); a rewrap while the
    /// daemon runs is refused. An offline fleet command reads the encrypted stores with their keys.
    @Test func rewrappingUnderANewKeyEncryptionKeyKeepsEveryStore() throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        let client = try daemon.connect()
        for user in ["alice", "bob"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title, body) VALUES ('n', 'kept')"])
        }
        let newKey = daemon.directory.path + "/kek.new"
        try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: newKey))
        let ctl = { (arguments: [String]) in try run([userstorectlPath] + arguments) }
        let busy = try ctl(["keys", "rewrap", "--config", daemon.configPath, "--new-key-file", newKey])
        #expect(busy.status == 3, "\(busy.stdout) \(busy.stderr)")
        #expect(daemon.stop() == 0)

        let rewrapped = try ctl(["keys", "rewrap", "--config", daemon.configPath, "--new-key-file", newKey, "--json"])
        #expect(rewrapped.status == 0, "\(rewrapped.stderr)")
        #expect(rewrapped.stdout.contains("\"rewrapped\": 2"), "\(rewrapped.stdout)")
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyEncryptionKeyWrong"), "\(daemon.stderr)")

        try daemon.writeConfig(extra: "encryption:\n  keyFile: kek.new\n  keyStore: file://\(daemon.directory.path)/keys\n")
        let offline = try ctl(["verify", "--all", "--offline", "--config", daemon.configPath, "--json"])
        #expect(offline.status == 0, "\(offline.stdout) \(offline.stderr)")
        try daemon.start()
        let again = try daemon.connect()
        for user in ["alice", "bob"] {
            #expect(try again.call("io.userstore.Store.Query", ["user": .string(user), "sql": "SELECT body FROM notes"])["rows"] == [["kept"]])
        }
        #expect(daemon.stop() == 0)
    }

    /// A replicated plaintext store is encrypted on its next open, under a new file: the log
    /// ships it whole (a base) before its next commit, so that the replica never mixes its
    /// plaintext history with encrypted pages. The disk lost, it comes back whole, encrypted.
    @Test func aReplicatedPlaintextStoreEncryptedOnItsNextOpenIsRestoredWhole() throws {
        let replica = try TemporaryDirectory()
        let daemon = try DaemonHarness()
        let replication = "replication:\n  replica: \"file://\(replica.path)\"\n  litestream: \(litestreamPath)\n"
        try daemon.writeConfig(extra: replication)
        try daemon.start()
        _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'plaintext era')", "durable": true])
        #expect(daemon.stop() == 0)

        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon) + replication)
        try daemon.start()
        let client = try daemon.connect()
        #expect(try client.call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT count(*) FROM notes"])["rows"] == [[1]])
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'encrypted era')", "durable": true])
        daemon.stop(signal: SIGKILL)
        try FileManager.default.removeItem(atPath: daemon.dataDirectory)

        try daemon.start()
        let rows = try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes ORDER BY id"])["rows"]
        #expect(rows == [["plaintext era"], ["encrypted era"]], "\(String(describing: rows))")
        #expect(daemon.stop() == 0)
        let path = try #require(Self.storePath(daemon, "alice"))
        #expect(FileManager.default.contents(atPath: path)?.prefix(16) == Data("UserStore AES 1\u{0}".utf8))
    }

    /// `userstorectl encrypt --all`: every plaintext store encrypted ahead of traffic, with
    /// progress; Status then counts none plaintext, and the files are encrypted.
    @Test func encryptAllEncryptsEveryPlaintextStoreAheadOfTraffic() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let users = ["alice", "bob", "carol"]
        for user in users {
            _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": .string(user), "sql": "INSERT INTO notes (title, body) VALUES ('n', 'plain')"])
        }
        let refused = varlinkError { _ = try daemon.connect().call("io.userstore.Admin.EncryptStores", ["all": true]) }
        #expect(refused?.name == "io.userstore.Store.InvalidRequest", "\(String(describing: refused))")
        #expect(daemon.stop() == 0)

        try Self.writeKey(in: daemon)
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon))
        try daemon.start()
        let result = try run([userstorectlPath, "encrypt", "--all"], environment: ["USERSTORE_SOCKET": daemon.socketPath])
        #expect(result.status == 0, "\(result.stdout) \(result.stderr)")
        #expect(result.stdout.contains("[3/3]") && result.stdout.contains("3 stores encrypted, 0 failed"), "\(result.stdout)")
        let status = try daemon.connect().call("io.userstore.Admin.Status")
        #expect(status["encryptedStores"] == 3 && status["plaintextStores"] == 0, "\(status)")
        #expect(daemon.stop() == 0)
        for user in users {
            let path = try #require(Self.storePath(daemon, user))
            #expect(FileManager.default.contents(atPath: path)?.prefix(16) == Data("UserStore AES 1\u{0}".utf8), "\(user)")
        }
    }

    /// On S3 (SeaweedFS, looked into with boto3): the key store in a bucket of its own, the
    /// replica in another. No object of the replica holds the marker (log objects decoded); the
    /// disk lost, the store comes back with its key from the key store's bucket; the keys'
    /// bucket holds a record per user and no plaintext key. With the daemon stopped, `verify
    /// --offline` and `keys rewrap` work on the keys' bucket. The key store in the replica's own
    /// bucket and prefix is refused (exit 78).
    @Test func onS3TheKeyStoreIsABucketOfItsOwnAndTheReplicaHoldsOnlyCiphertext() throws {
        let server = try SeaweedFS()
        let daemon = try Self.onS3Daemon(server)
        try daemon.start()
        let marker = "marker-\(UUID().uuidString)"
        let client = try daemon.connect()
        for user in ["alice", "bob"] {
            _ = try client.call("io.userstore.Store.Execute", ["user": .string(user), "sql": .string("INSERT INTO notes (title, body) VALUES ('n', '\(marker)')"), "durable": true])
        }
        daemon.stop(signal: SIGKILL)
        let scratch = try TemporaryDirectory()
        var holding: [String] = []
        for key in try server.keys("data") {
            let file = scratch.path + "/object"
            guard try server.probe(["get", "data", key, file]).status == 0, let data = FileManager.default.contents(atPath: file) else { continue }
            let bytes = Array(data)
            if let segment = try? LogSegment.decode(bytes) {
                if segment.records.contains(where: { $0.pages.contains { Data($0.data).range(of: Data(marker.utf8)) != nil } }) { holding.append(key) }
            } else if data.range(of: Data(marker.utf8)) != nil {
                holding.append(key)
            }
        }
        #expect(holding.isEmpty, "the marker is in \(holding)")
        let keyObjects = try server.keys("keys").filter { $0.hasPrefix("k/") }
        #expect(keyObjects.contains("k/check") && keyObjects.filter { $0.hasPrefix("k/users/") }.count == 2, "\(keyObjects)")

        try FileManager.default.removeItem(atPath: daemon.dataDirectory)
        try daemon.start()
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": .string("SELECT count(*) FROM notes WHERE body = '\(marker)'")])["rows"] == [[1]])
        #expect(daemon.stop() == 0)

        // With the daemon stopped, the offline tools reach the keys' bucket: verify reads every
        // store with its key; keys rewrap puts both records under a new key-encryption key,
        // which the daemon then reads them with.
        let ctl = { (arguments: [String]) in try run([userstorectlPath] + arguments, environment: server.environment) }
        let verified = try ctl(["verify", "--all", "--offline", "--config", daemon.configPath, "--json"])
        #expect(verified.status == 0, "\(verified.stdout) \(verified.stderr)")
        let newKey = daemon.directory.path + "/kek.new"
        try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: newKey))
        let rewrapped = try ctl(["keys", "rewrap", "--config", daemon.configPath, "--new-key-file", newKey, "--json"])
        #expect(rewrapped.status == 0, "\(rewrapped.stderr)")
        #expect(rewrapped.stdout.contains("\"rewrapped\": 2"), "\(rewrapped.stdout)")
        try daemon.writeConfig(extra: Self.onS3Config(server, keyFile: "kek.new"))
        try daemon.start()
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "bob", "sql": .string("SELECT count(*) FROM notes WHERE body = '\(marker)'")])["rows"] == [[1]])
        #expect(daemon.stop() == 0)

        try daemon.writeConfig(extra: Self.onS3Config(server, keyStore: server.replicaURL(bucket: "data", prefix: "r")))
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("encryption.keyStore"), "\(daemon.stderr)")
    }

    /// The operator's tools on encrypted stores: an export is plaintext, and imported again it is
    /// encrypted on the way in (in place encrypted before anything opens it); verify, QueryStores
    /// and a release's trial on copies all read encrypted stores.
    @Test func exportImportVerifyQueryAllAndTrialsWorkOnEncryptedStores() throws {
        let daemon = try Self.encryptedDaemon()
        try daemon.start()
        let client = try daemon.connect()
        _ = try client.call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'travelling row')"])
        var exported = Data()
        try client.stream("io.userstore.Admin.ExportStore", ["user": "alice"]) { reply in
            if case .string(let chunk)? = reply["chunk"], let bytes = Data(base64Encoded: chunk) { exported.append(bytes) }
        }
        let file = daemon.directory.path + "/alice-export.sqlite"
        try exported.write(to: URL(fileURLWithPath: file))
        #expect(exported.prefix(16) == Data("SQLite format 3\u{0}".utf8))
        _ = try client.call("io.userstore.Admin.ImportStore", ["user": "bob", "path": .string(file)])
        let bobPath = try #require(Self.storePath(daemon, "bob"))
        #expect(FileManager.default.contents(atPath: bobPath)?.prefix(16) == Data("UserStore AES 1\u{0}".utf8), "the import is in place in plaintext")
        #expect(try client.call("io.userstore.Store.Query", ["user": "bob", "sql": "SELECT body FROM notes"])["rows"] == [["travelling row"]])

        let environment = ["USERSTORE_SOCKET": daemon.socketPath]
        let verify = try run([userstorectlPath, "verify", "--all", "--json"], environment: environment)
        #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
        var rows: [JSONValue] = []
        try client.stream("io.userstore.Admin.QueryStores", ["sql": "SELECT body FROM notes", "all": true]) { reply in
            if let found = reply["rows"]?.arrayValue { rows += found }
        }
        #expect(rows.count == 2 && rows.allSatisfy { $0 == ["travelling row"] }, "\(rows)")
        try daemon.addMigration("0007_x.sql", "ALTER TABLE notes ADD COLUMN x INTEGER;\nUPDATE notes SET x = 0;")
        _ = try client.call("io.userstore.Admin.Reload")
        var trials: [[String: JSONValue]] = []
        try client.stream("io.userstore.Admin.TrialRelease", ["users": ["alice", "bob"]]) { reply in if reply["user"] != nil { trials.append(reply) } }
        #expect(trials.count == 2 && trials.allSatisfy { $0["ok"] == true && $0["toVersion"] == 7 }, "\(trials)")
        #expect(daemon.stop() == 0)
    }

    /// `encryption.credential`: the key-encryption key read from `$CREDENTIALS_DIRECTORY/NAME`
    /// (what `LoadCredentialEncrypted=` gives the unit), winning over `keyFile`; without the
    /// directory, the daemon stops (exit 78, `KeyEncryptionKeyMissing`).
    @Test func theKeyEncryptionKeyComesFromASystemdCredential() throws {
        let daemon = try DaemonHarness()
        let credentials = try TemporaryDirectory()
        try (Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()).write(toFile: credentials.path + "/userstore-kek", atomically: true, encoding: .utf8)
        try Self.writeKey(in: daemon) // another key in keyFile: the credential wins
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon) + "  credential: userstore-kek\n")
        try daemon.start(environment: ["CREDENTIALS_DIRECTORY": credentials.path])
        _ = try daemon.connect().call("io.userstore.Store.Execute", ["user": "alice", "sql": "INSERT INTO notes (title, body) VALUES ('n', 'sealed')"])
        #expect(daemon.stop() == 0)
        try daemon.start(environment: ["CREDENTIALS_DIRECTORY": credentials.path])
        #expect(try daemon.connect().call("io.userstore.Store.Query", ["user": "alice", "sql": "SELECT body FROM notes"])["rows"] == [["sealed"]])
        #expect(daemon.stop() == 0)
        // The key file alone is not the key store's key.
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon))
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyEncryptionKeyWrong"), "\(daemon.stderr)")
        // The credential named, and no credentials directory.
        try daemon.writeConfig(extra: Self.encryptionConfig(daemon) + "  credential: userstore-kek\n")
        try daemon.start(waitForReady: false)
        #expect(exitStatus(daemon) == 78)
        #expect(daemon.stderr.contains("KeyEncryptionKeyMissing"), "\(daemon.stderr)")
    }
}
