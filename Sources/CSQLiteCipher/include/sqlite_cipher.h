#ifndef USERSTORE_SQLITE_CIPHER_H
#define USERSTORE_SQLITE_CIPHER_H

#include <sqlite3.h>

#include "page_seal.h"

/// What the layer asks of a cipher (UserStoreCore's PageCipher, which owns the keys): its page
/// key (page_seal.h), with which the layer seals and opens the pages it finds in a file's reads
/// and writes and masks its WAL's frame checksums. `cipher` is the pointer handed over with
/// USERSTORE_FCNTL_CIPHER.
typedef struct userstore_cipher_hooks {
    /// The cipher's page key, alive as long as the cipher is retained.
    userstore_page_key *(*key)(void *cipher);
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
