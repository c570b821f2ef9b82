#ifndef USERSTORE_PAGE_SEAL_H
#define USERSTORE_PAGE_SEAL_H

/// The page format of an encrypted store (docs/encryption.md, "The page"), sealed and opened
/// with AES-256-GCM from OpenSSL's libcrypto, with a cipher context kept per key; and the mask
/// of its WAL's frame checksums.
///
/// A stored page, `size` bytes:
///
///     [0, size-32)         the page, encrypted (page 1: from byte 100 on)
///     [size-32, size-20)   the nonce (12 bytes)
///     [size-20, size-4)    the GCM tag
///     [size-4, size)       zero (spare, authenticated)
///
/// Authenticated with it: the page number (4 bytes, big-endian), page 1's stored first 100
/// bytes (which stay plaintext, with "UserStore AES 1\0" in place of SQLite's magic), and the
/// spare bytes.
///
/// Here rather than in swift-crypto because swift-crypto's AES.GCM makes a new AEAD context,
/// expands the key and allocates the ciphertext, the tag and the box on every call: several
/// times the cost of the AES itself for a 4 KB page (docs/performance.md, "Encryption").
/// UserStoreCore's tests open pages sealed here with swift-crypto's AES.GCM, as a reference.
typedef struct userstore_page_key userstore_page_key;

/// What sealing or opening a page returns.
enum {
    USERSTORE_PAGE_OK = 0,
    /// Page 1's reserved bytes (its byte 20) are fewer than 32: no room for the nonce and the tag.
    USERSTORE_PAGE_NO_ROOM = 1,
    /// The page fails authentication: damaged, tampered with, another key's, or plaintext.
    USERSTORE_PAGE_UNAUTHENTIC = 2,
    /// libcrypto failed (out of memory).
    USERSTORE_PAGE_FAILED = 3,
};

/// A context for the 32-byte page key `key` and the 32-byte WAL checksum mask key `maskKey`;
/// null when libcrypto cannot make one. Safe to use from several threads (calls on one key are
/// serialised).
userstore_page_key *userstore_page_key_new(const unsigned char *key, const unsigned char *maskKey);
void userstore_page_key_free(userstore_page_key *key);

/// Encrypts page `number` (`size` bytes at `plain`) into `stored` (`size` bytes, not
/// overlapping). Nonces are unique per key context: 8 random bytes drawn when the context is
/// made (and again after 2^32 pages), then a counter.
int userstore_page_seal(userstore_page_key *key, unsigned int number, const void *plain, void *stored, int size);

/// Decrypts page `number` (`size` bytes at `stored`) into `plain` (may be `stored`). Nothing
/// is written to `plain` unless the page is authentic.
int userstore_page_open(userstore_page_key *key, unsigned int number, const void *stored, void *plain, int size);

/// XORs `field` (8 bytes: a WAL frame header's checksums) with the first 8 bytes of
/// HMAC-SHA256(mask key, salt (8 bytes) || offset (8 bytes, big-endian)).
void userstore_page_mask(const userstore_page_key *key, const void *salt, long long offset, void *field);

#endif
