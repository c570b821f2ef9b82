import CSQLiteCipher
import Crypto
import Foundation
import GRDBSQLite

/// Encrypts a store's pages with its data key: AES-256-GCM, a fresh random nonce per page
/// write, the nonce and the tag in the page's reserved bytes (docs/encryption.md, "The page").
///
/// The layer under SQLite (CSQLiteCipher) hands every page of an encrypted database and of its
/// WAL to ``seal(page:plain:into:)`` on the way to the disk and to ``open(page:stored:into:)``
/// on the way back, so SQLite's cache, and everything above it, only sees plaintext, and
/// everything below it — the files, the WAL frames the host log ships, the bucket's objects —
/// only ciphertext.
///
/// A stored page, `size` bytes:
///
///     [0, size-32)         the page, encrypted (page 1: from byte 100 on; see below)
///     [size-32, size-20)   the nonce (12 random bytes)
///     [size-20, size-4)    the GCM tag
///     [size-4, size)       zero (spare, authenticated)
///
/// Authenticated with it: the page's number, so that no page can stand in for another, and on
/// page 1 its first 100 bytes. Those stay in plaintext — the database header (page size,
/// reserved bytes, page count, schema version: no user data), which SQLite reads before the
/// layer knows the file's key and the daemon lists versions from (StoreFileInspector) — except
/// that its first 16 bytes read ``storedMagic`` instead of "SQLite format 3", so that nothing
/// takes the file for a plaintext database.
public final class PageCipher: @unchecked Sendable {
    /// What a page that fails authentication is reported as (`StoreDamaged`).
    public static let unauthenticPage = "a page fails authentication (damaged, changed on disk, or encrypted with another key)"

    /// The bytes SQLite must keep free at the end of each page (`SQLITE_FCNTL_RESERVE_BYTES`).
    public static let reservedBytes = Int(USERSTORE_CIPHER_RESERVE)
    /// Page 1's first 16 bytes on disk.
    public static let storedMagic = Array("UserStore AES 1\u{0}".utf8)
    static let sqliteMagic = Array("SQLite format 3\u{0}".utf8)
    /// Page 1's plaintext header.
    static let headerSize = 100

    private let pageKey: SymmetricKey
    /// HMAC-SHA256 keyed with the mask key, copied for each mask: the key's schedule is done once
    /// (it was a third of the cost of writing a frame).
    private let maskTemplate: HMAC<SHA256>

    /// A cipher with `dataKey` (32 bytes): the page key and the WAL checksum mask key are drawn
    /// from it with HKDF-SHA256, one per purpose.
    public init(dataKey: SymmetricKey) {
        precondition(dataKey.bitCount == 256, "a store's data key is 256 bits")
        // The layer is SQLite's default before any connection this cipher is for is opened
        // (a process that did not call SQLiteProcessSettings.apply() first: userstorectl).
        _ = Self.layerRegistered
        pageKey = HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore page v1".utf8), outputByteCount: 32)
        maskTemplate = HMAC<SHA256>(key: HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore wal checksum mask v1".utf8), outputByteCount: 32))
    }

    /// Why a page could not be sealed or opened.
    public enum Failure: Error, Equatable {
        /// The page's reserved bytes (page 1's byte 20) are fewer than ``reservedBytes``.
        case noRoomForTag
        /// The page fails authentication: damaged, tampered with, another key's, or plaintext.
        case unauthentic
        /// The encrypting layer is not the connection's VFS (SQLite was initialised with
        /// another default VFS before ``SQLiteProcessSettings/apply()``).
        case layerUnavailable
    }

    /// Encrypts page `number` from `plain` into `stored` (the same size; they may not overlap).
    public func seal(page number: UInt32, plain: UnsafeRawBufferPointer, into stored: UnsafeMutableRawBufferPointer) throws(Failure) {
        let size = plain.count
        let trailer = size - Self.reservedBytes
        let start = number == 1 ? Self.headerSize : 0
        if number == 1 {
            guard size > Self.headerSize, plain[20] >= Self.reservedBytes else { throw .noRoomForTag }
            stored.baseAddress!.copyMemory(from: Self.storedMagic, byteCount: 16)
            (stored.baseAddress! + 16).copyMemory(from: plain.baseAddress! + 16, byteCount: Self.headerSize - 16)
        }
        for index in size - 4..<size { stored[index] = 0 }
        let nonce = Self.randomNonce()
        let box: AES.GCM.SealedBox
        do {
            box = try withAuthenticated(number, stored: UnsafeRawBufferPointer(stored)) { context in
                try AES.GCM.seal(UnsafeRawBufferPointer(rebasing: plain[start..<trailer]), using: pageKey, nonce: nonce, authenticating: context)
            }
        } catch {
            throw .unauthentic // cannot happen with a valid key and nonce
        }
        box.ciphertext.copyBytes(to: UnsafeMutableRawBufferPointer(rebasing: stored[start..<trailer]))
        nonce.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: stored[trailer..<trailer + 12]).copyMemory(from: $0) }
        box.tag.copyBytes(to: UnsafeMutableRawBufferPointer(rebasing: stored[trailer + 12..<trailer + 28]))
    }

    /// 12 random bytes from glibc's `arc4random_buf` (getrandom-seeded ChaCha20, buffered per
    /// thread): a syscall-free nonce, where swift-crypto's `Nonce()` cost a third of a page's
    /// sealing.
    private static func randomNonce() -> AES.GCM.Nonce {
        withUnsafeTemporaryAllocation(byteCount: 12, alignment: 4) { bytes in
            arc4random_buf(bytes.baseAddress!, 12)
            return try! AES.GCM.Nonce(data: UnsafeRawBufferPointer(bytes)) // 12 bytes: always valid
        }
    }

    /// Decrypts page `number` from `stored` into `plain` (the same size; they may be the same
    /// buffer). Nothing is written to `plain` unless the page is authentic.
    public func open(page number: UInt32, stored: UnsafeRawBufferPointer, into plain: UnsafeMutableRawBufferPointer) throws(Failure) {
        let size = stored.count
        let trailer = size - Self.reservedBytes
        let start = number == 1 ? Self.headerSize : 0
        guard trailer > start else { throw .unauthentic }
        if number == 1 { guard stored.starts(with: Self.storedMagic) else { throw .unauthentic } }
        let opened: Data
        do {
            let box = try AES.GCM.SealedBox(nonce: AES.GCM.Nonce(data: stored[trailer..<trailer + 12]),
                                            ciphertext: stored[start..<trailer], tag: stored[trailer + 12..<trailer + 28])
            opened = try withAuthenticated(number, stored: stored) { try AES.GCM.open(box, using: pageKey, authenticating: $0) }
        } catch {
            throw .unauthentic
        }
        if number == 1 {
            plain.baseAddress!.copyMemory(from: Self.sqliteMagic, byteCount: 16)
            if UnsafeRawPointer(plain.baseAddress) != stored.baseAddress {
                (plain.baseAddress! + 16).copyMemory(from: stored.baseAddress! + 16, byteCount: Self.headerSize - 16)
            }
        }
        opened.copyBytes(to: UnsafeMutableRawBufferPointer(rebasing: plain[start..<trailer]))
        for index in trailer..<size { plain[index] = 0 }
    }

    /// Whether page 1 of the encrypted store at `path` (its database file) opens with this
    /// cipher: which of two keys a store is encrypted with, during a rotation.
    public func opensFirstPage(of path: String) -> Bool {
        guard let header = FileHead(path: path, count: 100)?.bytes, header.count == 100 else { return false }
        let raw = Int(header[16]) << 8 | Int(header[17])
        let size = raw == 1 ? 65_536 : raw
        guard size >= 512, let page = FileHead(path: path, count: size)?.bytes, page.count == size else { return false }
        var plain = [UInt8](repeating: 0, count: size)
        do {
            try page.withUnsafeBytes { stored in try plain.withUnsafeMutableBytes { try open(page: 1, stored: stored, into: $0) } }
            return true
        } catch {
            return false
        }
    }

    /// Runs `body` with what is authenticated beside the encrypted bytes: the page number,
    /// page 1's stored header, and the spare bytes (on the stack: this runs for every page).
    private func withAuthenticated<T>(_ number: UInt32, stored: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        let header = number == 1 ? Self.headerSize : 0
        return try withUnsafeTemporaryAllocation(byteCount: 8 + header, alignment: 4) { buffer in
            withUnsafeBytes(of: number.bigEndian) { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 4) }
            if header > 0 { (buffer.baseAddress! + 4).copyMemory(from: stored.baseAddress!, byteCount: header) }
            (buffer.baseAddress! + 4 + header).copyMemory(from: stored.baseAddress! + stored.count - 4, byteCount: 4)
            return try body(UnsafeRawBufferPointer(buffer))
        }
    }

    /// XORs `field` (8 bytes) with the mask of a WAL frame header at `offset` under `salt` (8 bytes).
    func mask(salt: UnsafeRawBufferPointer, offset: Int64, field: UnsafeMutableRawBufferPointer) {
        var mac = maskTemplate
        mac.update(data: salt)
        withUnsafeBytes(of: UInt64(bitPattern: offset).bigEndian) { mac.update(data: $0) }
        mac.finalize().withUnsafeBytes { mask in
            for index in 0..<8 { field[index] ^= mask[index] }
        }
    }
}

extension PageCipher {
    /// Whether the layer that encrypts pages is SQLite's default VFS (registered by
    /// ``SQLiteProcessSettings/apply()``, or here for a process that did not call it).
    static let layerRegistered: Bool = {
        _ = SQLiteProcessSettings.apply()
        return registerLayer()
    }()

    static func registerLayer() -> Bool {
        var hooks = userstore_cipher_hooks(
            seal: { context, number, plain, stored, size in
                let cipher = Unmanaged<PageCipher>.fromOpaque(context!).takeUnretainedValue()
                do {
                    try cipher.seal(page: number, plain: UnsafeRawBufferPointer(start: plain, count: Int(size)),
                                    into: UnsafeMutableRawBufferPointer(start: stored, count: Int(size)))
                    return 0
                } catch {
                    return 1
                }
            },
            open: { context, number, stored, plain, size in
                let cipher = Unmanaged<PageCipher>.fromOpaque(context!).takeUnretainedValue()
                do {
                    try cipher.open(page: number, stored: UnsafeRawBufferPointer(start: stored, count: Int(size)),
                                    into: UnsafeMutableRawBufferPointer(start: plain, count: Int(size)))
                    return 0
                } catch {
                    return 1
                }
            },
            mask: { context, salt, offset, field in
                Unmanaged<PageCipher>.fromOpaque(context!).takeUnretainedValue()
                    .mask(salt: UnsafeRawBufferPointer(start: salt, count: 8), offset: offset, field: UnsafeMutableRawBufferPointer(start: field, count: 8))
            },
            retain: { context in _ = Unmanaged<PageCipher>.fromOpaque(context!).retain() },
            release: { context in Unmanaged<PageCipher>.fromOpaque(context!).release() }
        )
        return userstore_register_cipher_vfs(&hooks) == SQLITE_OK
    }

    /// Encrypts the database `connection` has open as `main`, and its WAL, with this cipher.
    /// Call before anything of the file is read past its header (GRDB's `prepareDatabase`): a
    /// new file gets ``reservedBytes`` per page, and temporary files (sorts, statement
    /// journals) stay in memory so that no page leaves the connection in plaintext.
    public func install(on connection: OpaquePointer) throws(Failure) {
        guard Self.layerRegistered else { throw .layerUnavailable }
        var reserve = Int32(Self.reservedBytes)
        _ = sqlite3_file_control(connection, "main", SQLITE_FCNTL_RESERVE_BYTES, &reserve)
        let context = Unmanaged.passRetained(self).toOpaque()
        guard sqlite3_file_control(connection, "main", USERSTORE_FCNTL_CIPHER, context) == SQLITE_OK else {
            Unmanaged<PageCipher>.fromOpaque(context).release()
            throw .layerUnavailable
        }
        _ = sqlite3_exec(connection, "PRAGMA temp_store = MEMORY", nil, nil, nil)
    }

    /// The cipher of the database `connection` has open as `main`; nil when it is not encrypted.
    public static func of(_ connection: OpaquePointer) -> PageCipher? {
        var context: UnsafeMutableRawPointer?
        guard sqlite3_file_control(connection, "main", USERSTORE_FCNTL_CIPHER_OF, &context) == SQLITE_OK, let context else { return nil }
        return Unmanaged<PageCipher>.fromOpaque(context).takeRetainedValue()
    }
}
