import Crypto
import Foundation
import GRDB
import GRDBSQLite
import Testing
@testable import UserStoreCore

/// ``PageCipher`` and the layer under SQLite that hands it every page of an encrypted store
/// and of its WAL: what is written is found in no file, and reads back; another key, a plain
/// reader and a tampered page are refused, never read as data.
struct PageCipherTests {
    /// A connection set up as the daemon's stores are (WAL, EXCLUSIVE locking), encrypting
    /// with `key` when one is given.
    static func open(_ path: String, key: SymmetricKey?, cacheSize: Int? = nil) throws -> DatabaseQueue {
        #expect(PageCipher.layerRegistered) // the encrypting layer, before the connection
        let cipher = key.map { PageCipher(dataKey: $0) }
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try cipher?.install(on: db.sqliteConnection!)
            try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE")
            if let cacheSize { try db.execute(sql: "PRAGMA cache_size = \(cacheSize)") }
        }
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA journal_mode = WAL") }
        return queue
    }

    /// The files under `directory` whose bytes hold `marker`.
    static func files(holding marker: String, under directory: String) throws -> [String] {
        let needle = Data(marker.utf8)
        return try FileManager.default.subpathsOfDirectory(atPath: directory).filter { name in
            guard let bytes = FileManager.default.contents(atPath: directory + "/" + name) else { return false }
            return bytes.range(of: needle) != nil
        }
    }

    /// Rows, an index, a transaction larger than the page cache (spilled to the WAL before it
    /// commits, its pages written again before the commit), a rolled-back spill, a checkpoint,
    /// a close and a reopen: the marker reads back every time and is in no file of the store.
    /// The same writes without a key leave the marker in the files (the search can find it).
    @Test(arguments: [true, false])
    func aMarkerReadsBackAndIsInNoFile(encrypted: Bool) throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite"
        let marker = "marker-\(UUID().uuidString)"
        let key = encrypted ? SymmetricKey(size: .bits256) : nil
        var filesDuringWrites: [String] = []
        do {
            let queue = try Self.open(path, key: key, cacheSize: 20)
            try queue.write { db in
                try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT)")
                try db.execute(sql: "CREATE INDEX notes_title ON notes (title)")
                try db.execute(sql: "INSERT INTO notes (title, body) VALUES (?, 'first')", arguments: [marker])
            }
            try queue.write { db in
                try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO notes (title, body) SELECT ? || i, ? FROM n",
                               arguments: [marker, marker])
                try db.execute(sql: "UPDATE notes SET body = body || '!' WHERE id % 3 = 0")
            }
            try queue.inTransaction { db in
                try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO notes (title, body) SELECT 'gone', ? FROM n", arguments: [marker])
                return .rollback
            }
            filesDuringWrites = try Self.files(holding: marker, under: directory.path)
            try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)") }
            #expect(try queue.read { try String.fetchOne($0, sql: "SELECT body FROM notes WHERE title = ?", arguments: [marker]) } == "first")
            try queue.close()
        }
        let filesAfterClose = try Self.files(holding: marker, under: directory.path)
        let reopened = try Self.open(path, key: key)
        let (count, gone, indexed, check) = try reopened.read { db in
            (try Int.fetchOne(db, sql: "SELECT count(*) FROM notes WHERE title LIKE ? || '%'", arguments: [marker]),
             try Int.fetchOne(db, sql: "SELECT count(*) FROM notes WHERE title = 'gone'"),
             try String.fetchOne(db, sql: "SELECT body FROM notes INDEXED BY notes_title WHERE title = ?", arguments: [marker]),
             try String.fetchOne(db, sql: "PRAGMA integrity_check"))
        }
        #expect(count == 2001 && gone == 0 && indexed == "first" && check == "ok", "\(String(describing: count)) \(String(describing: gone)) \(String(describing: indexed)) \(String(describing: check))")
        if encrypted {
            #expect(filesDuringWrites.isEmpty, "the marker is in \(filesDuringWrites)")
            #expect(filesAfterClose.isEmpty, "the marker is in \(filesAfterClose)")
        } else {
            #expect(filesDuringWrites.contains("store.sqlite-wal"), "\(filesDuringWrites)")
            #expect(filesAfterClose.contains("store.sqlite"), "\(filesAfterClose)")
        }
    }

    /// An encrypted store with its commits only in its WAL (copied between two commits, as a
    /// crash leaves it): SQLite's recovery reads the frames back through the cipher.
    @Test func aCopyTakenBetweenCommitsRecoversFromItsWAL() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite", copy = try directory.folder("copy") + "/store.sqlite"
        let key = SymmetricKey(size: .bits256)
        let queue = try Self.open(path, key: key)
        try queue.write { try $0.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT)") }
        for index in 0..<50 {
            try queue.write { try $0.execute(sql: "INSERT INTO notes (title) VALUES (?)", arguments: ["note \(index)"]) }
        }
        #expect((FileHead.size(of: path + "-wal") ?? 0) > 0)
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        try FileManager.default.copyItem(atPath: path + "-wal", toPath: copy + "-wal")
        try queue.close()
        let recovered = try Self.open(copy, key: key)
        #expect(try recovered.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM notes") } == 50)
        #expect(try Self.files(holding: "note 1", under: directory.path).isEmpty)
    }

    /// The schema version of an encrypted store whose newest header is only in its WAL (a copy
    /// taken between commits, as a crash leaves it) is read through the cipher; without it the
    /// version is unknown (-1), never a wrong number. The WAL stays as it was.
    @Test func anEncryptedStoresVersionIsReadThroughItsWAL() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite", copy = try directory.folder("copy") + "/store.sqlite"
        let key = SymmetricKey(size: .bits256)
        let queue = try Self.open(path, key: key)
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY)")
            try db.execute(sql: "PRAGMA user_version = 7")
        }
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        try FileManager.default.copyItem(atPath: path + "-wal", toPath: copy + "-wal")
        try queue.close()
        let walBytes = FileHead.size(of: copy + "-wal") ?? 0
        #expect(walBytes > 0 && StoreFileInspector.headerVersion(of: copy) == nil)
        #expect(StoreFileInspector.schemaVersion(of: copy, cipher: PageCipher(dataKey: key)) == 7)
        #expect(StoreFileInspector.schemaVersion(of: copy) == -1)
        #expect(FileHead.size(of: copy + "-wal") == walBytes)
    }

    /// Another key, a reader without the layer's key, and a page changed on disk: named SQLite
    /// errors (`SQLITE_IOERR_DATA`: the page failed authentication; `SQLITE_NOTADB`), never rows.
    @Test func anotherKeyAPlainReaderAndATamperedPageAreRefused() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite"
        let key = SymmetricKey(size: .bits256)
        let queue = try Self.open(path, key: key)
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT)")
            try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO notes (title) SELECT 'note ' || i FROM n")
        }
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try queue.close()
        #expect(StoreFileInspector.damage(of: path) == nil)

        func readError(key: SymmetricKey?) -> ResultCode? {
            do {
                let reader = try Self.open(path, key: key)
                _ = try reader.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM notes") }
                try reader.close()
                return nil
            } catch let error as DatabaseError {
                return error.extendedResultCode
            } catch {
                return .SQLITE_ERROR
            }
        }
        #expect(readError(key: key) == nil)
        #expect(readError(key: SymmetricKey(size: .bits256)) == .SQLITE_IOERR_DATA)
        #expect(readError(key: nil) == .SQLITE_NOTADB)

        // One bit of page 2's ciphertext.
        let original = try #require(FileManager.default.contents(atPath: path))
        var tampered = original
        tampered[4096 + 10] ^= 0x01
        try tampered.write(to: URL(fileURLWithPath: path))
        #expect(readError(key: key) == .SQLITE_IOERR_DATA)
        // One bit of page 1's plaintext header (authenticated): the page count.
        tampered = original
        tampered[31] ^= 0x01
        try tampered.write(to: URL(fileURLWithPath: path))
        #expect(readError(key: key) == .SQLITE_IOERR_DATA)
        try original.write(to: URL(fileURLWithPath: path))
        #expect(readError(key: key) == nil)
    }

    /// The page format itself: a sealed page opens to what was sealed, with the plaintext
    /// header kept and the magic replaced; another page number, or a changed byte, does not.
    @Test func aSealedPageOpensOnlyAsItself() throws {
        let cipher = PageCipher(dataKey: SymmetricKey(size: .bits256))
        var plain = [UInt8](repeating: 0, count: 4096)
        plain.replaceSubrange(0..<16, with: PageCipher.sqliteMagic)
        plain[16] = 0x10 // 4096
        plain[20] = UInt8(PageCipher.reservedBytes)
        for index in 100..<4064 { plain[index] = UInt8(index % 251) }
        var stored = [UInt8](repeating: 0, count: 4096)
        try plain.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try cipher.seal(page: 1, plain: from, into: $0) } }
        #expect(Array(stored[0..<16]) == PageCipher.storedMagic)
        #expect(stored[16..<100] == plain[16..<100])
        let encrypted = stored[100..<4064] != plain[100..<4064]
        #expect(encrypted, "page 1's body is stored as it was")

        func opened(_ bytes: [UInt8], as number: UInt32) -> [UInt8]? {
            var out = [UInt8](repeating: 0xee, count: bytes.count)
            do {
                try bytes.withUnsafeBytes { from in try out.withUnsafeMutableBytes { try cipher.open(page: number, stored: from, into: $0) } }
                return out
            } catch {
                #expect(out.allSatisfy { $0 == 0xee }, "nothing is written for a page that fails")
                return nil
            }
        }
        let same = opened(stored, as: 1) == plain
        #expect(same, "page 1 opens to what was sealed")
        #expect(opened(stored, as: 2) == nil)
        var changed = stored
        changed[4070] ^= 0x80 // the tag
        #expect(opened(changed, as: 1) == nil)

        // A page whose reserved bytes cannot hold the nonce and the tag is not sealed.
        plain[20] = 0
        #expect(throws: PageCipher.Failure.noRoomForTag) {
            try plain.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try cipher.seal(page: 1, plain: from, into: $0) } }
        }
    }

    /// The documented page format, read with swift-crypto's AES.GCM as an independent
    /// reference (the layer seals with OpenSSL's): the page key is HKDF-SHA256 of the data key
    /// ("userstore page v1"); the nonce, the tag and the spare bytes lie where the format says;
    /// the page number (and page 1's stored header) are authenticated. Two seals of one page
    /// never share a nonce.
    @Test(arguments: [UInt32(1), 2, 77])
    func aSealedPageFollowsTheDocumentedFormat(number: UInt32) throws {
        let dataKey = SymmetricKey(size: .bits256)
        let cipher = PageCipher(dataKey: dataKey)
        let pageKey = HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore page v1".utf8), outputByteCount: 32)
        var plain = (0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(number)) }
        if number == 1 {
            plain.replaceSubrange(0..<16, with: PageCipher.sqliteMagic)
            plain[16] = 0x10
            plain[20] = UInt8(PageCipher.reservedBytes)
        }
        for index in 4064..<4096 { plain[index] = 0 }
        func seal() throws -> [UInt8] {
            var stored = [UInt8](repeating: 0, count: 4096)
            try plain.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try cipher.seal(page: number, plain: from, into: $0) } }
            return stored
        }
        let stored = try seal(), again = try seal()
        #expect(stored[4064..<4076] != again[4064..<4076], "a nonce used twice")
        #expect(stored[4092..<4096].allSatisfy { $0 == 0 })

        let start = number == 1 ? 100 : 0
        var authenticated = withUnsafeBytes(of: number.bigEndian) { Array($0) }
        if number == 1 { authenticated += stored[0..<100] }
        authenticated += stored[4092..<4096]
        let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: stored[4064..<4076]), ciphertext: stored[start..<4064], tag: stored[4076..<4092])
        let opened = try AES.GCM.open(box, using: pageKey, authenticating: authenticated)
        #expect(Array(opened) == Array(plain[start..<4064]))
        var otherNumber = withUnsafeBytes(of: (number + 1).bigEndian) { Array($0) }
        otherNumber += authenticated[4...]
        #expect(throws: (any Error).self) { try AES.GCM.open(box, using: pageKey, authenticating: otherNumber) }

        // And the other way: a page sealed by swift-crypto in this format opens here.
        var forged = stored
        let nonce = AES.GCM.Nonce()
        let sealed = try AES.GCM.seal(plain[start..<4064], using: pageKey, nonce: nonce, authenticating: authenticated)
        forged.replaceSubrange(start..<4064, with: sealed.ciphertext)
        forged.replaceSubrange(4064..<4076, with: Array(nonce))
        forged.replaceSubrange(4076..<4092, with: sealed.tag)
        var back = [UInt8](repeating: 0xee, count: 4096)
        try forged.withUnsafeBytes { from in try back.withUnsafeMutableBytes { try cipher.open(page: number, stored: from, into: $0) } }
        #expect(back == plain)
    }

    /// The WAL's checksum mask is HMAC-SHA256 under the mask key (HKDF-SHA256 of the data key,
    /// "userstore wal checksum mask v1") of the salt and the frame's offset, its first 8 bytes
    /// XORed in: checked against swift-crypto's HMAC (the layer computes it with OpenSSL's SHA-256).
    @Test func theWALChecksumMaskIsHMACSHA256UnderTheMaskKey() {
        let dataKey = SymmetricKey(size: .bits256)
        let cipher = PageCipher(dataKey: dataKey)
        let maskKey = HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore wal checksum mask v1".utf8), outputByteCount: 32)
        let original: [UInt8] = [1, 2, 3, 4, 5, 6, 7, 8]
        for offset: Int64 in [32, 4152, 1 << 33 + 7] {
            let salt: [UInt8] = (0..<8).map { _ in .random(in: 0...255) }
            var field = original
            salt.withUnsafeBytes { salt in field.withUnsafeMutableBytes { cipher.mask(salt: salt, offset: offset, field: $0) } }
            let message = salt + withUnsafeBytes(of: UInt64(offset).bigEndian) { Array($0) }
            let code = Array(HMAC<SHA256>.authenticationCode(for: message, using: maskKey))
            #expect(field == (0..<8).map { original[$0] ^ code[$0] }, "offset \(offset)")
        }
    }
}

extension PageCipherTests {
    /// A copy through the backup API (BackupKeeper: backups, release trials) of an encrypted
    /// store larger than the copy's page cache (pages written in no order, page 1 last) is
    /// encrypted with the same key, and reads back.
    @Test func aCopyOfAnEncryptedStoreIsEncryptedWithItsKey() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path + "/store.sqlite", copy = directory.path + "/copy.sqlite"
        let key = SymmetricKey(size: .bits256)
        let queue = try Self.open(path, key: key)
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT)")
            try db.execute(sql: "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) INSERT INTO notes (title) SELECT 'copied ' || printf('%.1000c', 'x') FROM n")
        }
        try queue.writeWithoutTransaction { db in try BackupKeeper.copy(db.sqliteConnection!, to: copy) }
        try queue.close()
        #expect(try Self.files(holding: "copied", under: directory.path).isEmpty)
        let reopened = try Self.open(copy, key: key)
        #expect(try reopened.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM notes") } == 3000)
    }
}
