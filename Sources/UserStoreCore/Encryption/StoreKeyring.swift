import Crypto
import Foundation

/// The data keys of every user's store, each kept only wrapped by the key-encryption key in a
/// ``KeyStore`` apart from the data (docs/encryption.md).
///
/// Records (binary, in the key store):
///
///     users/<ab>/<cd>/<user>  "USK1" nonce(12) key(32) tag(16): the data key, AES-256-GCM under
///                             the key-encryption key, the user ID authenticated with it; while
///                             the key is rotated, followed by "USN1" and the next key, wrapped
///                             the same way; or "USE1" and the erase's time (RFC 3339): destroyed
///     check                   "USC1" nonce(12) text tag(16): a known text under the key-encryption
///                             key, which tells a wrong key-encryption key at start
// @unchecked: SymmetricKey is an immutable value swift-crypto does not mark Sendable.
public final class StoreKeyring: @unchecked Sendable {
    private let keyEncryptionKey: SymmetricKey
    public let store: any KeyStore

    public init(keyEncryptionKey: SymmetricKey, store: any KeyStore) {
        self.keyEncryptionKey = keyEncryptionKey
        self.store = store
    }

    /// A keyring with the key-encryption key in `keyFile` (``KeyEncryptionKey/load(_:)``).
    public convenience init(keyFile: String, store: any KeyStore) throws(KeyEncryptionKey.Failure) {
        self.init(keyEncryptionKey: try KeyEncryptionKey.load(keyFile), store: store)
    }

    /// Why encryption cannot start (the daemon exits 78 with it).
    public enum SetupError: Error, CustomStringConvertible, Equatable {
        /// The key store's check record does not open with this key-encryption key.
        case wrongKey(location: String)
        /// The key store cannot be read or written.
        case keyStoreUnavailable(location: String, message: String)
        /// A rotation of the key-encryption key was begun and not finished (`check.next` is there).
        case rotationUnderWay(location: String)

        public var description: String {
            switch self {
            case .wrongKey(let location):
                return "the key-encryption key is not the one the key store \(location) was made with (its check record does not open): the wrong key file or credential"
            case .keyStoreUnavailable(let location, let message):
                return "the key store \(location) cannot be used: \(message)"
            case .rotationUnderWay(let location):
                return "a rotation of the key-encryption key of the key store \(location) was begun and not finished: run `userstorectl keys rewrap` again to finish it"
            }
        }
    }

    static let keyMagic = Array("USK1".utf8), nextMagic = Array("USN1".utf8), erasedMagic = Array("USE1".utf8), checkMagic = Array("USC1".utf8)
    /// A wrapped key's length: nonce, key, tag.
    static let wrappedLength = 12 + 32 + 16
    static let checkText = Array("userstore key-encryption key check v1".utf8)

    /// Checks the key-encryption key against the key store's check record, writing one into a
    /// key store that has none (a new one).
    public func verify() async throws(SetupError) {
        let existing: [UInt8]?
        do {
            if try await store.read("check.next") != nil { throw SetupError.rotationUnderWay(location: store.location) }
            existing = try await store.read("check")
        } catch let error as SetupError {
            throw error
        } catch {
            throw .keyStoreUnavailable(location: store.location, message: "\(error)")
        }
        guard let existing else {
            do {
                try await store.write("check", Self.checkMagic + (try seal(Self.checkText, authenticating: Array("check".utf8))))
            } catch {
                throw .keyStoreUnavailable(location: store.location, message: "\(error)")
            }
            return
        }
        guard existing.starts(with: Self.checkMagic), (try? open(Array(existing.dropFirst(4)), authenticating: Array("check".utf8))) == Self.checkText else {
            throw .wrongKey(location: store.location)
        }
    }

    /// Rewraps every data key under `newKey` (the key-encryption key's rotation: no store is
    /// rewritten), with the daemon stopped. Resumable: a `check.next` record (the known text
    /// under the new key) marks the rotation begun — the daemon refuses to start while it is
    /// there — and each record is rewrapped unless it already opens with the new key; the
    /// `check` record is replaced last. `progress` gets (records done, records in all). Returns
    /// how many records were rewrapped. This keyring must hold the old key (or, for a rotation
    /// to finish, either).
    public func rewrap(to newKey: SymmetricKey, progress: (Int, Int) throws -> Void = { _, _ in }) async throws -> Int {
        try await rewrap(to: StoreKeyring(keyEncryptionKey: newKey, store: store), progress: progress)
    }

    /// ``rewrap(to:progress:)-(SymmetricKey,_)`` with the new key as `next`'s (its key store is ignored).
    public func rewrap(to next: StoreKeyring, progress: (Int, Int) throws -> Void = { _, _ in }) async throws -> Int {
        let context = Array("check".utf8)
        let check = try await store.read("check")
        let finished = check.map { $0.starts(with: Self.checkMagic) && (try? next.open(Array($0.dropFirst(4)), authenticating: context)) == Self.checkText } ?? false
        if finished, try await store.read("check.next") == nil { return 0 }
        if check == nil, try await store.names(under: "users/").isEmpty {
            // A key store never used: nothing to rewrap, the new key is its key from now on.
            try await store.write("check", Self.checkMagic + (try next.seal(Self.checkText, authenticating: context)))
            return 0
        }
        if !finished {
            guard let check, check.starts(with: Self.checkMagic), (try? open(Array(check.dropFirst(4)), authenticating: context)) == Self.checkText else {
                throw SetupError.wrongKey(location: store.location)
            }
        }
        try await store.write("check.next", Self.checkMagic + (try next.seal(Self.checkText, authenticating: context)))
        let names = try await store.names(under: "users/").sorted()
        var rewrapped = 0
        for (done, name) in names.enumerated() {
            let user = try UserID(String(name.split(separator: "/").last ?? ""))
            if let record = try await store.read(name), record.starts(with: Self.keyMagic) {
                var keys: [[UInt8]] = []
                var offset = 4
                var already = true
                while record.count >= offset + Self.wrappedLength {
                    let wrapped = Array(record[offset..<(offset + Self.wrappedLength)])
                    if let key = try? next.open(wrapped, authenticating: Self.keyContext(user)) {
                        keys.append(key)
                    } else if let key = try? open(wrapped, authenticating: Self.keyContext(user)) {
                        keys.append(key)
                        already = false
                    } else {
                        throw StoreError.storeKeyMissing(user: user, message: "its record opens with neither key-encryption key")
                    }
                    offset += Self.wrappedLength + 4 // past "USN1" before a next key
                }
                if !already {
                    var rewritten = Self.keyMagic + (try next.seal(keys[0], authenticating: Self.keyContext(user)))
                    if keys.count > 1 { rewritten += Self.nextMagic + (try next.seal(keys[1], authenticating: Self.keyContext(user))) }
                    try await store.write(name, rewritten)
                    rewrapped += 1
                }
            }
            try progress(done + 1, names.count)
        }
        try await store.write("check", Self.checkMagic + (try next.seal(Self.checkText, authenticating: context)))
        try await store.remove("check.next")
        return rewrapped
    }

    /// The record name of `user`'s key.
    static func recordName(of user: UserID) -> String {
        "users/" + StoreLayout.hashPrefix(of: user) + "/" + user.rawValue
    }

    /// The cipher of `user`'s store. With `create`, a user without a key (never encrypted, or
    /// erased) gets a new one, stored durably before this returns — before anything is written
    /// with it. Without: ``StoreError/storeKeyMissing(user:message:)`` when the key store holds
    /// no key of the user, ``StoreError/storeErased(user:)`` when it was destroyed.
    public func cipher(for user: UserID, create: Bool) async throws(StoreError) -> PageCipher {
        let name = Self.recordName(of: user)
        let record = try await readRecord(of: user)
        if let record, record.starts(with: Self.keyMagic) { return try keys(in: record, of: user).current }
        let erased = record?.starts(with: Self.erasedMagic) ?? false
        // A record that is neither a key nor a tombstone is never replaced by a new key.
        guard create, record == nil || erased else {
            if erased { throw .storeErased(user: user) }
            throw .storeKeyMissing(user: user, message: record == nil
                ? "the key store \(store.location) holds no data key of the user"
                : "the key store's record of the user is not a key record")
        }
        let key = SymmetricKey(size: .bits256)
        do {
            let wrapped = try key.withUnsafeBytes { try seal(Array($0), authenticating: Self.keyContext(user)) }
            try await store.write(name, Self.keyMagic + wrapped)
        } catch {
            throw .storageFailure(user: user, message: "the key store \(store.location) cannot be written: \(error)")
        }
        return PageCipher(dataKey: key)
    }

    /// The ciphers of `user`'s current data key and, while a rotation is under way (begun, not
    /// finished: a crash), of the next one.
    public func ciphers(for user: UserID) async throws(StoreError) -> (current: PageCipher, next: PageCipher?) {
        try keys(in: try await keyRecord(of: user), of: user)
    }

    /// Begins the rotation of `user`'s data key: a next key is made and stored beside the
    /// current one, durably (an interrupted rotation's next key is kept). Returns both.
    public func beginRotation(of user: UserID) async throws(StoreError) -> (current: PageCipher, next: PageCipher) {
        let record = try await keyRecord(of: user)
        let current = Array(record[4..<(4 + Self.wrappedLength)])
        if record.count == 8 + 2 * Self.wrappedLength {
            let keys = try keys(in: record, of: user)
            return (keys.current, keys.next!)
        }
        let next = SymmetricKey(size: .bits256)
        do {
            let wrapped = try next.withUnsafeBytes { try seal(Array($0), authenticating: Self.keyContext(user)) }
            try await store.write(Self.recordName(of: user), Self.keyMagic + current + Self.nextMagic + wrapped)
        } catch {
            throw .storageFailure(user: user, message: "the key store \(store.location) cannot be written: \(error)")
        }
        return (try keys(in: Self.keyMagic + current, of: user).current, PageCipher(dataKey: next))
    }

    /// Finishes the rotation of `user`'s data key: the next key becomes the only one, durably
    /// (the store is encrypted with it by now).
    public func finishRotation(of user: UserID) async throws(StoreError) {
        let record = try await keyRecord(of: user)
        guard record.count == 8 + 2 * Self.wrappedLength else { return } // no rotation under way
        do {
            try await store.write(Self.recordName(of: user), Self.keyMagic + Array(record[(8 + Self.wrappedLength)...]))
        } catch {
            throw .storageFailure(user: user, message: "the key store \(store.location) cannot be written: \(error)")
        }
    }

    /// `user`'s key record; the named error when it has none.
    private func keyRecord(of user: UserID) async throws(StoreError) -> [UInt8] {
        guard let record = try await readRecord(of: user), record.starts(with: Self.keyMagic), record.count >= 4 + Self.wrappedLength else {
            _ = try await cipher(for: user, create: false) // the named error: erased or missing
            throw .storeKeyMissing(user: user, message: "the key store holds no data key of the user")
        }
        return record
    }

    /// `user`'s record as the key store holds it (nil: none); `StorageFailure` when it cannot be read.
    private func readRecord(of user: UserID) async throws(StoreError) -> [UInt8]? {
        do {
            return try await store.read(Self.recordName(of: user))
        } catch {
            throw .storageFailure(user: user, message: "the key store \(store.location) cannot be read: \(error)")
        }
    }

    /// The keys a key record holds.
    private func keys(in record: [UInt8], of user: UserID) throws(StoreError) -> (current: PageCipher, next: PageCipher?) {
        func key(at offset: Int) throws(StoreError) -> PageCipher {
            guard record.count >= offset + Self.wrappedLength,
                  let key = try? open(Array(record[offset..<(offset + Self.wrappedLength)]), authenticating: Self.keyContext(user)), key.count == 32 else {
                throw .storeKeyMissing(user: user, message: "the key store's record of the user's data key does not open with the key-encryption key (damaged, or another user's)")
            }
            return PageCipher(dataKey: SymmetricKey(data: key))
        }
        let current = try key(at: 4)
        let nextAt = 4 + Self.wrappedLength
        guard record.count >= nextAt + 4, record[nextAt..<(nextAt + 4)].elementsEqual(Self.nextMagic) else { return (current, nil) }
        return (current, try key(at: nextAt + 4))
    }

    /// Destroys `user`'s data key (erase by key): its record becomes a tombstone, durably, so
    /// that no copy of the store made before — a file, a backup, an object in the bucket or an
    /// older version of one — can be read again.
    public func destroy(_ user: UserID) async throws(StoreError) {
        let tombstone = Self.erasedMagic + Array(ISO8601DateFormatter().string(from: Date()).utf8)
        do {
            try await store.write(Self.recordName(of: user), tombstone)
        } catch {
            throw .storageFailure(user: user, message: "the key store \(store.location) cannot be written: \(error)")
        }
    }

    /// Whether the key store holds a key of `user` (a tombstone or nothing: false).
    public func hasKey(_ user: UserID) async throws -> Bool {
        try await store.read(Self.recordName(of: user))?.starts(with: Self.keyMagic) ?? false
    }

    /// Installs `cipher` (``cipher(ifEncrypted:user:keyring:)``; nil: a plaintext file) on
    /// `connection`, which has `user`'s store open as `main` and has read nothing yet.
    public static func install(_ cipher: PageCipher?, on connection: OpaquePointer, user: UserID) throws(StoreError) {
        do {
            try cipher?.install(on: connection)
        } catch {
            throw .storageFailure(user: user, message: "\(error)")
        }
    }

    /// The cipher of the store file at `path` of `user` when it is encrypted (nil: plaintext);
    /// ``StoreError/storeKeyMissing(user:message:)`` without a keyring. The file's header is
    /// read on the blocking pool.
    public static func cipher(ifEncrypted path: String, user: UserID, keyring: StoreKeyring?) async throws(StoreError) -> PageCipher? {
        guard await BlockingPool.run({ StoreFileInspector.isEncrypted(path) }) else { return nil }
        guard let keyring else { throw .storeKeyMissing(user: user, message: "the store is encrypted and this configuration has no encryption section") }
        return try await keyring.cipher(for: user, create: false)
    }

    private static func keyContext(_ user: UserID) -> [UInt8] { Array("userstore data key v1 ".utf8) + Array(user.rawValue.utf8) }

    private func seal(_ plain: [UInt8], authenticating context: [UInt8]) throws -> [UInt8] {
        let box = try AES.GCM.seal(plain, using: keyEncryptionKey, authenticating: context)
        return Array(box.nonce) + Array(box.ciphertext) + Array(box.tag)
    }

    private func open(_ sealed: [UInt8], authenticating context: [UInt8]) throws -> [UInt8] {
        guard sealed.count >= 28 else { throw PageCipher.Failure.unauthentic }
        let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: sealed[0..<12]), ciphertext: sealed[12..<(sealed.count - 16)], tag: sealed[(sealed.count - 16)...])
        return Array(try AES.GCM.open(box, using: keyEncryptionKey, authenticating: context))
    }
}

/// The key-encryption key, read from a file or a systemd credential.
public enum KeyEncryptionKey {
    /// Why the key could not be read.
    public struct Failure: Error, CustomStringConvertible, Equatable {
        public let description: String
    }

    /// The key in the file at `path`: 32 bytes, raw, or base64 (surrounding whitespace ignored).
    public static func load(_ path: String) throws(Failure) -> SymmetricKey {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw Failure(description: "cannot read \(path): \(FileManager.default.fileExists(atPath: path) ? "permission denied" : "no such file")")
        }
        return try parse(Array(data), source: path)
    }

    /// The key in `bytes`: 32 raw bytes, or their base64.
    public static func parse(_ bytes: [UInt8], source: String) throws(Failure) -> SymmetricKey {
        if bytes.count == 32 { return SymmetricKey(data: bytes) }
        let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard let decoded = Data(base64Encoded: text), decoded.count == 32 else {
            throw Failure(description: "\(source) does not hold a key-encryption key: 32 bytes, raw or base64, are needed (it holds \(bytes.count) bytes; make one with `head -c 32 /dev/urandom | base64`)")
        }
        return SymmetricKey(data: decoded)
    }
}
