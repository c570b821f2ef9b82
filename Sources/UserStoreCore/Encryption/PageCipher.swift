import CSQLiteCipher
import Crypto
import Foundation
import GRDBSQLite

/// Encrypts a store's pages with its data key: AES-256-GCM, a fresh nonce per page write, the
/// nonce and the tag in the page's reserved bytes (docs/encryption.md, "The page"). The page
/// format and the AES are CSQLiteCipher's `userstore_page_seal` / `userstore_page_open`
/// (OpenSSL's libcrypto, a context kept per cipher: swift-crypto's AES.GCM sets up a context
/// and allocates on every call, which cost several times the AES itself); the keys are drawn
/// here with swift-crypto.
///
/// The layer under SQLite (CSQLiteCipher) seals every page of an encrypted database and of its
/// WAL with this cipher's page key on the way to the disk and opens it on the way back (the
/// same C functions ``seal(page:plain:into:)`` and ``open(page:stored:into:)`` call), so
/// SQLite's cache, and everything above it, only sees plaintext, and
/// everything below it — the files, the WAL frames the host log ships, the bucket's objects —
/// only ciphertext.
///
/// A stored page, `size` bytes:
///
///     [0, size-32)         the page, encrypted (page 1: from byte 100 on; see below)
///     [size-32, size-20)   the nonce (12 bytes: 8 random per cipher, then a counter)
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
    /// Page 1's first 16 bytes as SQLite reads them (and a plaintext store's on disk).
    static let sqliteMagic = Array("SQLite format 3\u{0}".utf8)

    /// The page key's AES-GCM context and the mask key's HMAC state (CSQLiteCipher), freed with
    /// the cipher.
    private let pageKey: OpaquePointer

    /// A cipher with `dataKey` (32 bytes): the page key and the WAL checksum mask key are drawn
    /// from it with HKDF-SHA256, one per purpose.
    public init(dataKey: SymmetricKey) {
        precondition(dataKey.bitCount == 256, "a store's data key is 256 bits")
        // The layer is SQLite's default before any connection this cipher is for is opened
        // (a process that did not call SQLiteProcessSettings.apply() first: userstorectl).
        _ = Self.layerRegistered
        let key = HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore page v1".utf8), outputByteCount: 32)
        let maskKey = HKDF<SHA256>.deriveKey(inputKeyMaterial: dataKey, info: Array("userstore wal checksum mask v1".utf8), outputByteCount: 32)
        // Only fails when out of memory (libcrypto's allocations): nothing to serve with.
        pageKey = key.withUnsafeBytes { page in
            maskKey.withUnsafeBytes { mask in userstore_page_key_new(page.bindMemory(to: UInt8.self).baseAddress, mask.bindMemory(to: UInt8.self).baseAddress) }
        }!
    }

    deinit {
        userstore_page_key_free(pageKey)
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
        switch Int(userstore_page_seal(pageKey, number, plain.baseAddress, stored.baseAddress, Int32(plain.count))) {
        case Int(USERSTORE_PAGE_OK): return
        case Int(USERSTORE_PAGE_NO_ROOM): throw .noRoomForTag
        default: throw .unauthentic // libcrypto out of memory: the write fails
        }
    }

    /// Decrypts page `number` from `stored` into `plain` (the same size; they may be the same
    /// buffer). Nothing is written to `plain` unless the page is authentic.
    public func open(page number: UInt32, stored: UnsafeRawBufferPointer, into plain: UnsafeMutableRawBufferPointer) throws(Failure) {
        guard userstore_page_open(pageKey, number, stored.baseAddress, plain.baseAddress, Int32(stored.count)) == USERSTORE_PAGE_OK else {
            throw .unauthentic
        }
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

    /// XORs `field` (8 bytes) with the mask of a WAL frame header at `offset` under `salt` (8
    /// bytes): HMAC-SHA256 under the mask key (CSQLiteCipher's `userstore_page_mask`).
    func mask(salt: UnsafeRawBufferPointer, offset: Int64, field: UnsafeMutableRawBufferPointer) {
        userstore_page_mask(pageKey, salt.baseAddress, offset, field.baseAddress)
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
            key: { context in Unmanaged<PageCipher>.fromOpaque(context!).takeUnretainedValue().pageKey },
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
