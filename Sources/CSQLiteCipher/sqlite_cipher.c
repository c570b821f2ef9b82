// A VFS layer that encrypts the pages of the databases given a cipher, and of their WALs (see
// include/sqlite_cipher.h). The layout follows SQLite's own shims (ext/misc/vfsstat.c) and
// CSQLiteSizeCache: our file object first, the underlying one right after it. The page format
// itself (nonce, tag, what is authenticated) is page_seal.c's: this file only finds the pages in
// SQLite's reads and writes.
//
// What SQLite reads and writes, in WAL mode with the EXCLUSIVE locking the stores use:
//   database file: whole pages at page-aligned offsets, and the 100-byte header at open;
//   WAL: its 32-byte header; a frame's 24-byte header, then its page (two writes); whole
//   frames while recovering; a page alone when reading or checkpointing; a page alone again
//   when a transaction rewrites a page it already wrote (the frame header is then not written),
//   and the checksums of a frame header when it then rewrites the checksums after it.
// Anything else is refused with an I/O error and a log line rather than guessed at.
#include "sqlite_cipher.h"

#include <pthread.h>
#include <sys/stat.h>
#include <string.h>

enum { walHeaderSize = 32, frameHeaderSize = 24 };

typedef struct CipherFile {
    sqlite3_file base;
    /// The underlying VFS's file, in the same allocation, right after this struct.
    sqlite3_file *real;
    /// The cipher (retained), or null: the file passes through unchanged.
    void *cipher;
    /// The cipher's page key (page_seal.h), alive while `cipher` is retained.
    userstore_page_key *key;
    /// A WAL (else a database file).
    int isWAL;
    /// The page size, once known (0 before).
    int pageSize;
    /// A database file's name as SQLite gave it (alive until xClose): how its WAL finds it.
    const char *name;
    /// A buffer for whole pages or frames (one connection uses a file at a time).
    unsigned char *scratch;
    int scratchSize;
    /// The last frame header written to this WAL: its offset and page number.
    sqlite3_int64 headerOffset;
    unsigned int headerPage;
    /// The open databases that have a cipher (registry below).
    struct CipherFile *next;
} CipherFile;

static sqlite3_vfs *underlying;
static sqlite3_vfs layer;
static sqlite3_io_methods methods[3];
static userstore_cipher_hooks hooks;

static pthread_mutex_t registryLock = PTHREAD_MUTEX_INITIALIZER;
static CipherFile *registry;

#define REAL(file) (((CipherFile *)(file))->real)

static unsigned int bigEndian32(const unsigned char *bytes) {
    return (unsigned int)bytes[0] << 24 | (unsigned int)bytes[1] << 16 | (unsigned int)bytes[2] << 8 | bytes[3];
}

static int validPageSize(int size) { return size >= 512 && size <= 65536 && (size & (size - 1)) == 0; }

static int allZero(const unsigned char *bytes, int count) {
    for (int i = 0; i < count; i++) if (bytes[i]) return 0;
    return 1;
}

static unsigned char *scratch(CipherFile *p, int size) {
    if (p->scratchSize < size) {
        sqlite3_free(p->scratch);
        p->scratch = sqlite3_malloc(size);
        p->scratchSize = p->scratch ? size : 0;
    }
    return p->scratch;
}

/// Decrypts a page that is not all zeros (a page SQLite never wrote, inside a file a later
/// page extended, reads as zeros; SQLite finds a zeroed page of a b-tree corrupt).
static int openPage(CipherFile *p, unsigned int number, unsigned char *page, int size) {
    if (allZero(page, size)) return 0;
    return userstore_page_open(p->key, number, page, page, size);
}

/// The register of open databases with a cipher, for their WAL and journal opens.
static void enlist(CipherFile *p) {
    pthread_mutex_lock(&registryLock);
    p->next = registry;
    registry = p;
    pthread_mutex_unlock(&registryLock);
}

static void delist(CipherFile *p) {
    pthread_mutex_lock(&registryLock);
    for (CipherFile **link = &registry; *link; link = &(*link)->next) {
        if (*link == p) { *link = p->next; break; }
    }
    pthread_mutex_unlock(&registryLock);
}

/// The cipher of the open database named `name` (retained), or null; `size` gets the
/// database file's size (from the file system: the file object is another connection's).
static void *cipherOf(const char *name, sqlite3_int64 *size) {
    void *found = 0;
    pthread_mutex_lock(&registryLock);
    for (CipherFile *p = registry; p; p = p->next) {
        if (p->name && strcmp(p->name, name) == 0) {
            found = p->cipher;
            break;
        }
    }
    if (found) hooks.retain(found);
    pthread_mutex_unlock(&registryLock);
    struct stat status;
    *size = stat(name, &status) == 0 ? (sqlite3_int64)status.st_size : -1;
    return found;
}

// MARK: The database file

/// The database's page size, from its header's bytes 16-17 (the cipher leaves the header in
/// plaintext); 0 while the file is empty.
static int databasePageSize(CipherFile *p) {
    if (p->pageSize) return p->pageSize;
    unsigned char bytes[2];
    if (p->real->pMethods->xRead(p->real, bytes, 2, 16) != SQLITE_OK) return 0;
    int size = bytes[0] << 8 | bytes[1];
    if (size == 1) size = 65536;
    if (validPageSize(size)) p->pageSize = size;
    return p->pageSize;
}

static int databaseRead(CipherFile *p, void *buffer, int amount, sqlite3_int64 offset) {
    sqlite3_file *real = p->real;
    int size = databasePageSize(p);
    if (!size) return real->pMethods->xRead(real, buffer, amount, offset); // nothing written yet
    if (offset % size == 0 && amount % size == 0) {
        int rc = real->pMethods->xRead(real, buffer, amount, offset);
        if (rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ) return rc; // a short read is zero-filled
        for (int i = 0; i < amount / size; i++) {
            if (openPage(p, (unsigned int)(offset / size) + i + 1, (unsigned char *)buffer + (sqlite3_int64)i * size, size)) {
                return SQLITE_IOERR_DATA;
            }
        }
        return rc;
    }
    // Part of a page (the header SQLite reads at open): through the whole page.
    unsigned char *page = scratch(p, size);
    if (!page) return SQLITE_IOERR_NOMEM;
    int result = SQLITE_OK;
    for (sqlite3_int64 index = offset / size; index <= (offset + amount - 1) / size; index++) {
        int rc = real->pMethods->xRead(real, page, size, index * size);
        if (rc == SQLITE_IOERR_SHORT_READ) result = rc;
        else if (rc != SQLITE_OK) return rc;
        if (openPage(p, (unsigned int)index + 1, page, size)) return SQLITE_IOERR_DATA;
        sqlite3_int64 from = offset > index * size ? offset : index * size;
        sqlite3_int64 to = offset + amount < (index + 1) * size ? offset + amount : (index + 1) * size;
        memcpy((unsigned char *)buffer + (from - offset), page + (from - index * size), (size_t)(to - from));
    }
    return result;
}

static int databaseWrite(CipherFile *p, const void *buffer, int amount, sqlite3_int64 offset) {
    int size = 0;
    if (offset == 0 && amount >= 100) {
        const unsigned char *header = buffer;
        size = header[16] << 8 | header[17];
        if (size == 1) size = 65536;
    } else {
        size = databasePageSize(p);
        // Page 1 not written yet (a copy spilling its cache, pages in no order): SQLite writes
        // the database file a whole page at a time.
        if (!size && validPageSize(amount) && offset % amount == 0) size = amount;
    }
    if (!validPageSize(size) || offset % size || amount % size) {
        sqlite3_log(SQLITE_IOERR_WRITE, "userstore cipher: a write of %d bytes at %lld is not of whole pages", amount, offset);
        return SQLITE_IOERR_WRITE;
    }
    p->pageSize = size;
    unsigned char *stored = scratch(p, amount);
    if (!stored) return SQLITE_IOERR_NOMEM;
    for (int i = 0; i < amount / size; i++) {
        sqlite3_int64 at = (sqlite3_int64)i * size;
        if (userstore_page_seal(p->key, (unsigned int)(offset / size) + i + 1, (const unsigned char *)buffer + at, stored + at, size)) {
            sqlite3_log(SQLITE_IOERR_WRITE, "userstore cipher: page %lld has no room for its nonce and tag", offset / size + i + 1);
            return SQLITE_IOERR_WRITE;
        }
    }
    return p->real->pMethods->xWrite(p->real, stored, amount, offset);
}

// MARK: The WAL

/// The WAL's page size, from its header (plaintext); 0 while it has none.
static int walPageSize(CipherFile *p) {
    if (p->pageSize) return p->pageSize;
    unsigned char bytes[4];
    if (p->real->pMethods->xRead(p->real, bytes, 4, 8) != SQLITE_OK) return 0;
    int size = (int)bigEndian32(bytes);
    if (validPageSize(size)) p->pageSize = size;
    return p->pageSize;
}

static void learnWALPageSize(CipherFile *p, const unsigned char *header, int amount, sqlite3_int64 offset) {
    if (offset != 0 || amount < 12) return;
    int size = (int)bigEndian32(header + 8);
    if (validPageSize(size)) p->pageSize = size;
}

/// The page number in the header of the frame at `frame` (read from the file unless it is the
/// header last written).
static int framePage(CipherFile *p, sqlite3_int64 frame, unsigned int *number) {
    if (p->headerOffset == frame && p->headerPage) {
        *number = p->headerPage;
        return SQLITE_OK;
    }
    unsigned char bytes[4];
    int rc = p->real->pMethods->xRead(p->real, bytes, 4, frame);
    if (rc == SQLITE_OK) *number = bigEndian32(bytes);
    return rc == SQLITE_IOERR_SHORT_READ ? SQLITE_IOERR_DATA : rc;
}

static int walRead(CipherFile *p, void *buffer, int amount, sqlite3_int64 offset) {
    sqlite3_file *real = p->real;
    unsigned char *bytes = buffer;
    if (offset < walHeaderSize) {
        int rc = real->pMethods->xRead(real, buffer, amount, offset);
        if (rc == SQLITE_OK) learnWALPageSize(p, bytes, amount, offset);
        return rc;
    }
    int size = walPageSize(p);
    if (!size) return real->pMethods->xRead(real, buffer, amount, offset); // no header: SQLite ignores it all
    sqlite3_int64 frameSize = size + frameHeaderSize;
    sqlite3_int64 within = (offset - walHeaderSize) % frameSize, frame = offset - within;
    if (within + amount <= frameHeaderSize) {
        // Part of a frame header (its checksums, which a transaction rewriting a page reads
        // from the frame before): through the whole header, unmasked.
        unsigned char header[frameHeaderSize];
        int rc = real->pMethods->xRead(real, header, frameHeaderSize, frame);
        if (rc == SQLITE_IOERR_SHORT_READ) memset(buffer, 0, (size_t)amount); // as SQLite requires
        if (rc != SQLITE_OK) return rc;
        userstore_page_mask(p->key, header + 8, frame, header + 16);
        memcpy(buffer, header + within, (size_t)amount);
        return rc;
    }
    if (within == 0 && amount == frameSize) {
        int rc = real->pMethods->xRead(real, buffer, amount, offset);
        if (rc != SQLITE_OK) return rc;
        userstore_page_mask(p->key, bytes + 8, frame, bytes + 16);
        // Recovery reads whole frames: one that fails authentication is left as it is, so that
        // SQLite's checksum rejects it like a torn frame (the end of the log).
        openPage(p, bigEndian32(bytes), bytes + frameHeaderSize, size);
        return rc;
    }
    if (within == frameHeaderSize && amount <= size) {
        unsigned int number = 0;
        int rc = framePage(p, frame, &number);
        if (rc != SQLITE_OK) return rc;
        unsigned char *page = amount == size ? bytes : scratch(p, size);
        if (!page) return SQLITE_IOERR_NOMEM;
        rc = real->pMethods->xRead(real, page, size, offset);
        if (rc != SQLITE_OK) return rc == SQLITE_IOERR_SHORT_READ ? SQLITE_IOERR_DATA : rc;
        if (openPage(p, number, page, size)) return SQLITE_IOERR_DATA;
        if (page != bytes) memcpy(bytes, page, (size_t)amount);
        return SQLITE_OK;
    }
    sqlite3_log(SQLITE_IOERR_READ, "userstore cipher: a WAL read of %d bytes at %lld is not of a frame", amount, offset);
    return SQLITE_IOERR_READ;
}

static int walWrite(CipherFile *p, const void *buffer, int amount, sqlite3_int64 offset) {
    sqlite3_file *real = p->real;
    const unsigned char *bytes = buffer;
    if (offset < walHeaderSize) {
        learnWALPageSize(p, bytes, amount, offset);
        return real->pMethods->xWrite(real, buffer, amount, offset);
    }
    int size = walPageSize(p);
    sqlite3_int64 frameSize = size + frameHeaderSize;
    sqlite3_int64 within = size ? (offset - walHeaderSize) % frameSize : -1, frame = offset - within;
    if (within == 0 && (amount == frameHeaderSize || amount == frameSize)) {
        unsigned char *stored = scratch(p, amount);
        if (!stored) return SQLITE_IOERR_NOMEM;
        memcpy(stored, bytes, frameHeaderSize);
        userstore_page_mask(p->key, stored + 8, frame, stored + 16);
        if (amount == frameSize && userstore_page_seal(p->key, bigEndian32(bytes), bytes + frameHeaderSize, stored + frameHeaderSize, size)) {
            return SQLITE_IOERR_WRITE;
        }
        p->headerOffset = frame;
        p->headerPage = bigEndian32(bytes);
        return real->pMethods->xWrite(real, stored, amount, offset);
    }
    if (within == frameHeaderSize && amount == size) {
        unsigned int number = 0;
        int rc = framePage(p, frame, &number);
        if (rc != SQLITE_OK) return rc == SQLITE_IOERR_DATA ? SQLITE_IOERR_WRITE : rc;
        unsigned char *stored = scratch(p, size);
        if (!stored) return SQLITE_IOERR_NOMEM;
        if (userstore_page_seal(p->key, number, bytes, stored, size)) return SQLITE_IOERR_WRITE;
        return real->pMethods->xWrite(real, stored, amount, offset);
    }
    sqlite3_log(SQLITE_IOERR_WRITE, "userstore cipher: a WAL write of %d bytes at %lld is not of a frame", amount, offset);
    return SQLITE_IOERR_WRITE;
}

// MARK: The file methods

static int cipherClose(sqlite3_file *file) {
    CipherFile *p = (CipherFile *)file;
    int rc = SQLITE_OK;
    // Out of the register first: another connection's WAL open must not find a closing file.
    if (p->cipher && !p->isWAL) delist(p);
    if (p->real->pMethods) rc = p->real->pMethods->xClose(p->real);
    p->real->pMethods = 0;
    if (p->cipher) {
        hooks.release(p->cipher);
        p->cipher = 0;
        p->key = 0;
    }
    sqlite3_free(p->scratch);
    p->scratch = 0;
    p->scratchSize = 0;
    return rc;
}

static int cipherRead(sqlite3_file *file, void *buffer, int amount, sqlite3_int64 offset) {
    CipherFile *p = (CipherFile *)file;
    if (!p->cipher) return p->real->pMethods->xRead(p->real, buffer, amount, offset);
    return p->isWAL ? walRead(p, buffer, amount, offset) : databaseRead(p, buffer, amount, offset);
}

static int cipherWrite(sqlite3_file *file, const void *buffer, int amount, sqlite3_int64 offset) {
    CipherFile *p = (CipherFile *)file;
    if (!p->cipher) return p->real->pMethods->xWrite(p->real, buffer, amount, offset);
    return p->isWAL ? walWrite(p, buffer, amount, offset) : databaseWrite(p, buffer, amount, offset);
}

static int cipherTruncate(sqlite3_file *file, sqlite3_int64 size) { return REAL(file)->pMethods->xTruncate(REAL(file), size); }
static int cipherSync(sqlite3_file *file, int flags) { return REAL(file)->pMethods->xSync(REAL(file), flags); }
static int cipherFileSize(sqlite3_file *file, sqlite3_int64 *size) { return REAL(file)->pMethods->xFileSize(REAL(file), size); }
static int cipherLock(sqlite3_file *file, int level) { return REAL(file)->pMethods->xLock(REAL(file), level); }
static int cipherUnlock(sqlite3_file *file, int level) { return REAL(file)->pMethods->xUnlock(REAL(file), level); }
static int cipherCheckReservedLock(sqlite3_file *file, int *result) { return REAL(file)->pMethods->xCheckReservedLock(REAL(file), result); }

static int cipherFileControl(sqlite3_file *file, int op, void *argument) {
    CipherFile *p = (CipherFile *)file;
    if (op == USERSTORE_FCNTL_CIPHER) {
        if (p->isWAL || !p->name || !argument) return SQLITE_MISUSE;
        if (p->cipher) {
            delist(p);
            hooks.release(p->cipher);
        }
        p->cipher = argument;
        p->key = hooks.key(argument);
        p->pageSize = 0;
        enlist(p);
        return SQLITE_OK;
    }
    if (op == USERSTORE_FCNTL_CIPHER_OF) {
        if (p->cipher) hooks.retain(p->cipher);
        *(void **)argument = p->cipher;
        return SQLITE_OK;
    }
    return p->real->pMethods->xFileControl(p->real, op, argument);
}

static int cipherSectorSize(sqlite3_file *file) { return REAL(file)->pMethods->xSectorSize(REAL(file)); }
static int cipherDeviceCharacteristics(sqlite3_file *file) { return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file)); }
static int cipherShmMap(sqlite3_file *file, int region, int size, int extend, void volatile **mapped) {
    return REAL(file)->pMethods->xShmMap(REAL(file), region, size, extend, mapped);
}
static int cipherShmLock(sqlite3_file *file, int offset, int count, int flags) { return REAL(file)->pMethods->xShmLock(REAL(file), offset, count, flags); }
static void cipherShmBarrier(sqlite3_file *file) { REAL(file)->pMethods->xShmBarrier(REAL(file)); }
static int cipherShmUnmap(sqlite3_file *file, int delete) { return REAL(file)->pMethods->xShmUnmap(REAL(file), delete); }

static int cipherFetch(sqlite3_file *file, sqlite3_int64 offset, int amount, void **pointer) {
    // A memory map would hand SQLite the stored bytes: an encrypted file is read with xRead.
    if (((CipherFile *)file)->cipher) {
        *pointer = 0;
        return SQLITE_OK;
    }
    return REAL(file)->pMethods->xFetch(REAL(file), offset, amount, pointer);
}

static int cipherUnfetch(sqlite3_file *file, sqlite3_int64 offset, void *pointer) {
    return REAL(file)->pMethods->xUnfetch(REAL(file), offset, pointer);
}

static int cipherOpen(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *outFlags) {
    (void)vfs;
    CipherFile *p = (CipherFile *)file;
    memset(p, 0, sizeof *p);
    p->real = (sqlite3_file *)&p[1];
    void *inherited = 0;
    sqlite3_int64 databaseSize = 0;
    if (name && (flags & (SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL))) inherited = cipherOf(sqlite3_filename_database(name), &databaseSize);
    if (inherited && (flags & SQLITE_OPEN_MAIN_JOURNAL)) {
        hooks.release(inherited);
        // A new database's switch to WAL is its first transaction, with a journal that holds no
        // page (there was none before it); any other journal written would hold pages in
        // plaintext. Reading one (SQLite's look for a hot journal) writes nothing.
        if (databaseSize != 0 && !(flags & SQLITE_OPEN_READONLY)) {
            p->base.pMethods = 0;
            sqlite3_log(SQLITE_CANTOPEN, "userstore cipher: an encrypted database has no rollback journal (it would hold pages in plaintext): %s", name);
            return SQLITE_CANTOPEN;
        }
        inherited = 0;
    }
    int rc = underlying->xOpen(underlying, name, p->real, flags, outFlags);
    // SQLite expects pMethods set after xOpen, even when it failed (then xClose is called).
    const sqlite3_io_methods *real = p->real->pMethods;
    p->base.pMethods = real ? &methods[(real->iVersion < 1 ? 1 : real->iVersion > 3 ? 3 : real->iVersion) - 1] : 0;
    if (flags & SQLITE_OPEN_MAIN_DB) p->name = name;
    if (inherited) {
        if (rc == SQLITE_OK && real) {
            p->cipher = inherited;
            p->key = hooks.key(inherited);
            p->isWAL = 1;
        } else {
            hooks.release(inherited);
        }
    }
    return rc;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int registered = SQLITE_ERROR;

static void registerLayer(void) {
    underlying = sqlite3_vfs_find(0);
    if (!underlying || !hooks.key) return;
    for (int version = 1; version <= 3; version++) {
        sqlite3_io_methods *m = &methods[version - 1];
        memset(m, 0, sizeof *m);
        m->iVersion = version;
        m->xClose = cipherClose;
        m->xRead = cipherRead;
        m->xWrite = cipherWrite;
        m->xTruncate = cipherTruncate;
        m->xSync = cipherSync;
        m->xFileSize = cipherFileSize;
        m->xLock = cipherLock;
        m->xUnlock = cipherUnlock;
        m->xCheckReservedLock = cipherCheckReservedLock;
        m->xFileControl = cipherFileControl;
        m->xSectorSize = cipherSectorSize;
        m->xDeviceCharacteristics = cipherDeviceCharacteristics;
        if (version >= 2) {
            m->xShmMap = cipherShmMap;
            m->xShmLock = cipherShmLock;
            m->xShmBarrier = cipherShmBarrier;
            m->xShmUnmap = cipherShmUnmap;
        }
        if (version >= 3) {
            m->xFetch = cipherFetch;
            m->xUnfetch = cipherUnfetch;
        }
    }
    layer = *underlying;
    layer.zName = "userstore-cipher";
    layer.szOsFile = (int)sizeof(CipherFile) + underlying->szOsFile;
    layer.xOpen = cipherOpen;
    layer.pNext = 0;
    registered = sqlite3_vfs_register(&layer, 1);
}

static const userstore_cipher_hooks *pendingHooks;

static void registerWithHooks(void) {
    hooks = *pendingHooks;
    registerLayer();
}

int userstore_register_cipher_vfs(const userstore_cipher_hooks *given) {
    pendingHooks = given;
    pthread_once(&once, registerWithHooks);
    return registered;
}
