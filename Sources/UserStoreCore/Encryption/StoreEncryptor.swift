import Foundation
import GRDBSQLite

/// Rewrites a plaintext store as an encrypted one (docs/encryption.md, "Existing stores").
///
/// SQLite lays pages out around the bytes it reserves at their end, so a store made without
/// the 32 the cipher needs is first copied with them (`VACUUM INTO` after
/// `SQLITE_FCNTL_RESERVE_BYTES`: every table and index rebuilt, user_version and the other
/// header values kept); that copy is then sealed page by page into a new file, which replaces
/// the store durably (``DurableFile``). A crash leaves the plaintext store as it was, or the
/// encrypted one; the plaintext copy is removed either way.
public enum StoreEncryptor {
    /// Why a store could not be encrypted; it is left as it was.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Encrypts the plaintext store at `path` (open nowhere: the caller holds it closed) with
    /// `cipher`. Blocking.
    public static func encrypt(_ path: String, with cipher: PageCipher) throws(Failure) {
        let spaced = path + ".encrypting", sealed = path + ".encrypted.partial"
        defer { for leftover in [spaced, spaced + "-journal", sealed] { unlink(leftover) } }
        unlink(spaced)
        try copyWithReservedBytes(path, to: spaced)
        try seal(spaced, into: sealed, with: cipher)
        do {
            try DurableFile.publishDatabase(sealed, as: path)
        } catch {
            throw Failure(description: "\(error)")
        }
    }

    /// `VACUUM INTO to` from `path`, with ``PageCipher/reservedBytes`` free at each page's end.
    static func copyWithReservedBytes(_ path: String, to copy: String) throws(Failure) {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let connection else {
            throw Failure(description: "cannot open \(path): \(connection.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory")")
        }
        sqlite3_busy_timeout(connection, 5000)
        // Everything the WAL holds into the file first: the encrypted copy replaces the file and
        // its WAL together, and a crash in between must find the plaintext store whole.
        guard sqlite3_exec(connection, "PRAGMA wal_checkpoint(TRUNCATE)", nil, nil, nil) == SQLITE_OK,
              (FileHead.size(of: path + "-wal") ?? 0) == 0 else {
            throw Failure(description: "cannot checkpoint \(path) before encrypting it: \(String(cString: sqlite3_errmsg(connection)))")
        }
        var reserve = Int32(PageCipher.reservedBytes)
        _ = sqlite3_file_control(connection, "main", SQLITE_FCNTL_RESERVE_BYTES, &reserve)
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(connection, "VACUUM INTO ?", -1, &statement, nil) == SQLITE_OK,
              sqlite3_bind_text(statement, 1, copy, -1, unsafeBitCast(-1, to: sqlite3_destructor_type.self)) == SQLITE_OK,
              sqlite3_step(statement) == SQLITE_DONE else {
            throw Failure(description: "cannot copy \(path) with room for the cipher: \(String(cString: sqlite3_errmsg(connection)))")
        }
    }

    /// Seals every page of the plaintext database `plain` into the new file `sealed`, marked a
    /// WAL database (header bytes 18 and 19: what `journal_mode = WAL` writes).
    static func seal(_ plain: String, into sealed: String, with cipher: PageCipher) throws(Failure) {
        let input = open(plain, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw Failure(description: "cannot open \(plain): \(String(cString: strerror(errno)))") }
        defer { close(input) }
        let output = open(sealed, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard output >= 0 else { throw Failure(description: "cannot create \(sealed): \(String(cString: strerror(errno)))") }
        defer { close(output) }
        var header = [UInt8](repeating: 0, count: 100)
        guard pread(input, &header, 100, 0) == 100 else { throw Failure(description: "\(plain) has no database header") }
        let raw = Int(header[16]) << 8 | Int(header[17])
        let pageSize = raw == 1 ? 65_536 : raw
        guard Int(header[20]) >= PageCipher.reservedBytes else {
            throw Failure(description: "\(plain) keeps \(header[20]) bytes free per page, fewer than the cipher's \(PageCipher.reservedBytes)")
        }
        var page = [UInt8](repeating: 0, count: pageSize), stored = [UInt8](repeating: 0, count: pageSize)
        var number: UInt32 = 1
        while true {
            let count = pread(input, &page, pageSize, off_t(Int(number - 1) * pageSize))
            if count == 0 { break }
            guard count == pageSize else { throw Failure(description: "\(plain): page \(number) is short (\(count) bytes)") }
            if number == 1 { page[18] = 2; page[19] = 2 }
            do {
                try page.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try cipher.seal(page: number, plain: from, into: $0) } }
            } catch {
                throw Failure(description: "page \(number) of \(plain) cannot be sealed: \(error)")
            }
            guard pwrite(output, stored, pageSize, off_t(Int(number - 1) * pageSize)) == pageSize else {
                throw Failure(description: "cannot write \(sealed): \(String(cString: strerror(errno)))")
            }
            number += 1
        }
    }

    /// Rewrites the encrypted store at `path` (closed, its WAL empty) from `old` to `new`, page
    /// by page, durably; returns how many pages. Blocking.
    public static func reencrypt(_ path: String, from old: PageCipher, to new: PageCipher) throws(Failure) -> Int {
        if let wal = FileHead.size(of: path + "-wal"), wal > 0 { throw Failure(description: "\(path)'s WAL holds commits: checkpoint it first") }
        let sealed = path + ".rekeyed.partial"
        defer { unlink(sealed) }
        let input = open(path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw Failure(description: "cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(input) }
        let output = open(sealed, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard output >= 0 else { throw Failure(description: "cannot create \(sealed): \(String(cString: strerror(errno)))") }
        var header = [UInt8](repeating: 0, count: 100)
        guard pread(input, &header, 100, 0) == 100 else { close(output); throw Failure(description: "\(path) has no database header") }
        let raw = Int(header[16]) << 8 | Int(header[17])
        let pageSize = raw == 1 ? 65_536 : raw
        var page = [UInt8](repeating: 0, count: pageSize), stored = [UInt8](repeating: 0, count: pageSize)
        var number: UInt32 = 1
        do throws(Failure) {
            while true {
                let count = pread(input, &page, pageSize, off_t(Int(number - 1) * pageSize))
                if count == 0 { break }
                guard count == pageSize else { throw Failure(description: "\(path): page \(number) is short (\(count) bytes)") }
                if page.contains(where: { $0 != 0 }) {
                    do {
                        try page.withUnsafeMutableBytes { bytes in try old.open(page: number, stored: UnsafeRawBufferPointer(bytes), into: bytes) }
                        try page.withUnsafeBytes { from in try stored.withUnsafeMutableBytes { try new.seal(page: number, plain: from, into: $0) } }
                    } catch {
                        throw Failure(description: "page \(number) of \(path): \(error)")
                    }
                } else {
                    stored = page
                }
                guard pwrite(output, stored, pageSize, off_t(Int(number - 1) * pageSize)) == pageSize else {
                    throw Failure(description: "cannot write \(sealed): \(String(cString: strerror(errno)))")
                }
                number += 1
            }
        } catch {
            close(output)
            throw error
        }
        close(output)
        do {
            try DurableFile.publishDatabase(sealed, as: path)
        } catch {
            throw Failure(description: "\(error)")
        }
        return Int(number - 1)
    }
}
