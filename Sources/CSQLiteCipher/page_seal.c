// The page format of an encrypted store with OpenSSL's AES-256-GCM (see include/page_seal.h).
#include "page_seal.h"

// SHA256_Init/Update/Final: deprecated in OpenSSL 3 in favour of EVP_MD_CTX, whose copy
// allocates; a SHA256_CTX is a plain struct, copied for free (the WAL mask below).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

enum { reserve = 32, nonceSize = 12, tagSize = 16, spareSize = 4, headerSize = 100 };

static const unsigned char storedMagic[16] = "UserStore AES 1";
static const unsigned char sqliteMagic[16] = "SQLite format 3";

struct userstore_page_key {
    /// Serialises the calls on this key: a context holds one call's state.
    pthread_mutex_t lock;
    EVP_CIPHER_CTX *seal;
    EVP_CIPHER_CTX *open;
    /// The next nonce: a random prefix and a counter.
    unsigned char prefix[8];
    uint32_t counter;
    /// HMAC-SHA256 under the mask key (RFC 2104), its two keyed blocks absorbed once:
    /// read-only after creation, copied for each mask.
    SHA256_CTX maskInner, maskOuter;
};

static int drawPrefix(userstore_page_key *key) {
    size_t got = 0;
    while (got < sizeof key->prefix) {
        ssize_t count = getrandom(key->prefix + got, sizeof key->prefix - got, 0);
        if (count < 0) return 0;
        got += (size_t)count;
    }
    return 1;
}

userstore_page_key *userstore_page_key_new(const unsigned char *bytes, const unsigned char *maskKey) {
    userstore_page_key *key = calloc(1, sizeof *key);
    if (!key) return NULL;
    unsigned char pad[64];
    memset(pad, 0x36, sizeof pad);
    for (int i = 0; i < 32; i++) pad[i] ^= maskKey[i];
    SHA256_Init(&key->maskInner);
    SHA256_Update(&key->maskInner, pad, sizeof pad);
    memset(pad, 0x5c, sizeof pad);
    for (int i = 0; i < 32; i++) pad[i] ^= maskKey[i];
    SHA256_Init(&key->maskOuter);
    SHA256_Update(&key->maskOuter, pad, sizeof pad);
    OPENSSL_cleanse(pad, sizeof pad);
    pthread_mutex_init(&key->lock, NULL);
    key->seal = EVP_CIPHER_CTX_new();
    key->open = EVP_CIPHER_CTX_new();
    if (!key->seal || !key->open || !drawPrefix(key)
        || EVP_EncryptInit_ex(key->seal, EVP_aes_256_gcm(), NULL, bytes, NULL) != 1
        || EVP_DecryptInit_ex(key->open, EVP_aes_256_gcm(), NULL, bytes, NULL) != 1) {
        userstore_page_key_free(key);
        return NULL;
    }
    return key;
}

void userstore_page_key_free(userstore_page_key *key) {
    if (!key) return;
    EVP_CIPHER_CTX_free(key->seal); // cleanses the key schedule
    EVP_CIPHER_CTX_free(key->open);
    pthread_mutex_destroy(&key->lock);
    OPENSSL_cleanse(key, sizeof *key);
    free(key);
}

void userstore_page_mask(const userstore_page_key *key, const void *salt, long long offset, void *field) {
    unsigned char message[16], digest[SHA256_DIGEST_LENGTH];
    memcpy(message, salt, 8);
    for (int i = 0; i < 8; i++) message[8 + i] = (unsigned char)((unsigned long long)offset >> (56 - 8 * i));
    SHA256_CTX context = key->maskInner;
    SHA256_Update(&context, message, sizeof message);
    SHA256_Final(digest, &context);
    context = key->maskOuter;
    SHA256_Update(&context, digest, sizeof digest);
    SHA256_Final(digest, &context);
    unsigned char *bytes = field;
    for (int i = 0; i < 8; i++) bytes[i] ^= digest[i];
}

/// What is authenticated beside the encrypted bytes (at most 108 bytes): its length.
static int authenticated(unsigned char *out, unsigned int number, const unsigned char *stored, int size) {
    out[0] = (unsigned char)(number >> 24); out[1] = (unsigned char)(number >> 16);
    out[2] = (unsigned char)(number >> 8); out[3] = (unsigned char)number;
    int length = 4;
    if (number == 1) { memcpy(out + length, stored, headerSize); length += headerSize; }
    memcpy(out + length, stored + size - spareSize, spareSize);
    return length + spareSize;
}

int userstore_page_seal(userstore_page_key *key, unsigned int number, const void *plainBytes, void *storedBytes, int size) {
    const unsigned char *plain = plainBytes;
    unsigned char *stored = storedBytes;
    int trailer = size - reserve, start = number == 1 ? headerSize : 0;
    if (number == 1) {
        if (size <= headerSize || plain[20] < reserve) return USERSTORE_PAGE_NO_ROOM;
        memcpy(stored, storedMagic, 16);
        memcpy(stored + 16, plain + 16, headerSize - 16);
    }
    if (trailer <= start) return USERSTORE_PAGE_NO_ROOM;
    memset(stored + size - spareSize, 0, spareSize);
    unsigned char aad[4 + headerSize + spareSize];
    int aadLength = authenticated(aad, number, stored, size);
    unsigned char *nonce = stored + trailer, *tag = nonce + nonceSize;
    int length = 0, last = 0, ok = 1;

    pthread_mutex_lock(&key->lock);
    // Never a nonce twice: after 2^32 pages a new prefix, or no seal.
    if (key->counter == UINT32_MAX && drawPrefix(key)) key->counter = 0;
    if (key->counter == UINT32_MAX) ok = 0;
    if (ok) {
        uint32_t counter = key->counter++;
        memcpy(nonce, key->prefix, 8);
        nonce[8] = (unsigned char)(counter >> 24); nonce[9] = (unsigned char)(counter >> 16);
        nonce[10] = (unsigned char)(counter >> 8); nonce[11] = (unsigned char)counter;
        ok = EVP_EncryptInit_ex(key->seal, NULL, NULL, NULL, nonce) == 1
            && EVP_EncryptUpdate(key->seal, NULL, &length, aad, aadLength) == 1
            && EVP_EncryptUpdate(key->seal, stored + start, &length, plain + start, trailer - start) == 1
            && EVP_EncryptFinal_ex(key->seal, stored + start + length, &last) == 1
            && EVP_CIPHER_CTX_ctrl(key->seal, EVP_CTRL_GCM_GET_TAG, tagSize, tag) == 1;
    }
    pthread_mutex_unlock(&key->lock);
    return ok ? USERSTORE_PAGE_OK : USERSTORE_PAGE_FAILED;
}

int userstore_page_open(userstore_page_key *key, unsigned int number, const void *storedBytes, void *plainBytes, int size) {
    const unsigned char *stored = storedBytes;
    unsigned char *plain = plainBytes;
    int trailer = size - reserve, start = number == 1 ? headerSize : 0;
    if (trailer <= start) return USERSTORE_PAGE_UNAUTHENTIC;
    if (number == 1 && memcmp(stored, storedMagic, 16) != 0) return USERSTORE_PAGE_UNAUTHENTIC;
    unsigned char aad[4 + headerSize + spareSize], tag[tagSize];
    int aadLength = authenticated(aad, number, stored, size);
    memcpy(tag, stored + trailer + nonceSize, tagSize);
    // Decrypted into a buffer of its own: GCM releases plaintext before the tag is checked.
    unsigned char local[16384];
    unsigned char *opened = trailer - start <= (int)sizeof local ? local : malloc((size_t)(trailer - start));
    if (!opened) return USERSTORE_PAGE_FAILED;
    int length = 0, last = 0;

    pthread_mutex_lock(&key->lock);
    int ok = EVP_DecryptInit_ex(key->open, NULL, NULL, NULL, stored + trailer) == 1
        && EVP_DecryptUpdate(key->open, NULL, &length, aad, aadLength) == 1
        && EVP_DecryptUpdate(key->open, opened, &length, stored + start, trailer - start) == 1
        && EVP_CIPHER_CTX_ctrl(key->open, EVP_CTRL_GCM_SET_TAG, tagSize, tag) == 1
        && EVP_DecryptFinal_ex(key->open, opened + length, &last) == 1;
    pthread_mutex_unlock(&key->lock);

    if (ok) {
        if (number == 1) {
            if (plain != stored) memcpy(plain + 16, stored + 16, headerSize - 16);
            memcpy(plain, sqliteMagic, 16);
        }
        memcpy(plain + start, opened, (size_t)(trailer - start));
        memset(plain + trailer, 0, reserve);
    }
    if (opened != local) free(opened);
    return ok ? USERSTORE_PAGE_OK : USERSTORE_PAGE_UNAUTHENTIC;
}
