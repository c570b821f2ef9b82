#ifndef USERSTORE_SQLITE_CIPHER_H
#define USERSTORE_SQLITE_CIPHER_H

#include <sqlite3.h>

#include "page_seal.h"

/// What the layer asks of a cipher (UserStoreCore's PageCipher: the page format, the keys and
/// AES-256-GCM are Swift's; the layer only finds the pages in a file's reads and writes).
/// `cipher` is the pointer handed over with USERSTORE_FCNTL_CIPHER.
typedef struct userstore_cipher_hooks {
    /// Encrypts page `number` (`size` bytes at `plain`) into `stored` (`size` bytes, not
    /// overlapping `plain`). Returns 0, or nonzero when the page cannot be encrypted (its
    /// reserved bytes are too few to hold the nonce and the tag).
    int (*seal)(void *cipher, unsigned int number, const void *plain, void *stored, int size);
    /// Decrypts page `number` (`size` bytes at `stored`) into `plain` (may be `stored`).
    /// Returns 0, or nonzero when the page fails authentication (damaged, tampered with, another
    /// key's, or not encrypted at all).
    int (*open)(void *cipher, unsigned int number, const void *stored, void *plain, int size);
    /// XORs `field` (a WAL frame header's 8 checksum bytes) with a mask that only the key
    /// gives, drawn from the frame's salt (8 bytes) and its offset in the WAL: the checksums
    /// SQLite writes are of the plaintext page, and would let anyone holding the file test a
    /// guess of a page's content.
    void (*mask)(void *cipher, const void *salt, sqlite3_int64 offset, void *field);
    void (*retain)(void *cipher);
    void (*release)(void *cipher);
} userstore_cipher_hooks;

/// `sqlite3_file_control(db, "main", USERSTORE_FCNTL_CIPHER, cipher)`, before anything of the
/// file is read: the database's pages, and those of its WAL, are encrypted with `cipher` from
/// now on (the layer retains it until the file closes; SQLITE_NOTFOUND when the layer is not
/// the VFS of the connection). A new database must also be given USERSTORE_CIPHER_RESERVE
/// reserved bytes per page (SQLITE_FCNTL_RESERVE_BYTES) before its first write.
#define USERSTORE_FCNTL_CIPHER 0x55530001

/// `sqlite3_file_control(db, "main", USERSTORE_FCNTL_CIPHER_OF, &cipher)`: `cipher` (a
/// `void *`) gets the cipher of the connection's database, retained, or null when it is not
/// encrypted. What a copy made through the connection (the backup API) must be written with.
#define USERSTORE_FCNTL_CIPHER_OF 0x55530002

/// The bytes at the end of each page that hold its nonce and tag (and 4 spare).
#define USERSTORE_CIPHER_RESERVE 32

/// Registers, as SQLite's default VFS, a layer over the current default that encrypts the
/// pages of the databases given a cipher (USERSTORE_FCNTL_CIPHER) and of their WALs, and
/// passes every other file through unchanged. A rollback journal of an encrypted database is
/// refused (SQLITE_CANTOPEN) unless the database is still empty (its switch to WAL, a journal
/// without pages): it would hold pages in plaintext; encrypted stores are WAL databases and
/// keep temporary files in memory. Returns an SQLite result code; later calls do
/// nothing and return what the first returned.
int userstore_register_cipher_vfs(const userstore_cipher_hooks *hooks);

#endif
