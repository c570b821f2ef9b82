// A VFS that forwards everything to the default one and caches xFileSize under an EXCLUSIVE
// lock (see include/sqlite_size_cache.h for why). The layout follows SQLite's own shims
// (ext/misc/vfsstat.c): our file object first, the underlying one right after it.
#include "sqlite_size_cache.h"

#include <pthread.h>
#include <sqlite3.h>
#include <string.h>

typedef struct CachingFile {
    sqlite3_file base;
    /// The underlying VFS's file, in the same allocation, right after this struct.
    sqlite3_file *real;
    /// The lock level this handle holds (as last granted or released).
    int lock;
    /// The file's size while `lock` is EXCLUSIVE and it is known; -1 otherwise.
    sqlite3_int64 size;
} CachingFile;

static sqlite3_vfs *underlying;
static sqlite3_vfs layer;
/// One method table per version the underlying files may report (1 to 3).
static sqlite3_io_methods methods[3];

#define REAL(file) (((CachingFile *)(file))->real)

static void forget(CachingFile *file) { file->size = -1; }

static int cachingClose(sqlite3_file *file) {
    CachingFile *p = (CachingFile *)file;
    int rc = SQLITE_OK;
    if (p->real->pMethods) rc = p->real->pMethods->xClose(p->real);
    p->real->pMethods = 0;
    return rc;
}

static int cachingRead(sqlite3_file *file, void *buffer, int amount, sqlite3_int64 offset) {
    return REAL(file)->pMethods->xRead(REAL(file), buffer, amount, offset);
}

static int cachingWrite(sqlite3_file *file, const void *buffer, int amount, sqlite3_int64 offset) {
    CachingFile *p = (CachingFile *)file;
    int rc = p->real->pMethods->xWrite(p->real, buffer, amount, offset);
    // Past the kept size (SQLite announces growth with SQLITE_FCNTL_SIZE_HINT first anyway): ask again.
    if (rc != SQLITE_OK || offset + amount > p->size) forget(p);
    return rc;
}

static int cachingTruncate(sqlite3_file *file, sqlite3_int64 size) {
    // The underlying VFS may round the size up (a chunk size): ask it next time.
    forget((CachingFile *)file);
    return REAL(file)->pMethods->xTruncate(REAL(file), size);
}

static int cachingSync(sqlite3_file *file, int flags) {
    return REAL(file)->pMethods->xSync(REAL(file), flags);
}

static int cachingFileSize(sqlite3_file *file, sqlite3_int64 *size) {
    CachingFile *p = (CachingFile *)file;
    if (p->lock == SQLITE_LOCK_EXCLUSIVE && p->size >= 0) {
        *size = p->size;
        return SQLITE_OK;
    }
    int rc = p->real->pMethods->xFileSize(p->real, size);
    if (rc == SQLITE_OK && p->lock == SQLITE_LOCK_EXCLUSIVE) p->size = *size;
    return rc;
}

static int cachingLock(sqlite3_file *file, int level) {
    CachingFile *p = (CachingFile *)file;
    int rc = p->real->pMethods->xLock(p->real, level);
    if (rc == SQLITE_OK && level > p->lock) {
        if (level == SQLITE_LOCK_EXCLUSIVE) forget(p); // whatever was known before the lock is stale
        p->lock = level;
    }
    return rc;
}

static int cachingUnlock(sqlite3_file *file, int level) {
    CachingFile *p = (CachingFile *)file;
    int rc = p->real->pMethods->xUnlock(p->real, level);
    // Whatever the outcome, the EXCLUSIVE lock is no longer to be relied on.
    if (level < p->lock) p->lock = level;
    if (p->lock < SQLITE_LOCK_EXCLUSIVE) forget(p);
    return rc;
}

static int cachingCheckReservedLock(sqlite3_file *file, int *result) {
    return REAL(file)->pMethods->xCheckReservedLock(REAL(file), result);
}

/// Whether `op` leaves the file's size alone. SQLITE_FCNTL_SIZE_HINT does not (it may extend the
/// file by a chunk), nor may a control this list does not name: after those, the size is asked
/// of the underlying VFS again.
static int leavesSizeAlone(int op) {
    switch (op) {
    case SQLITE_FCNTL_LOCKSTATE: case SQLITE_FCNTL_SYNC_OMITTED: case SQLITE_FCNTL_PERSIST_WAL:
    case SQLITE_FCNTL_OVERWRITE: case SQLITE_FCNTL_VFSNAME: case SQLITE_FCNTL_POWERSAFE_OVERWRITE:
    case SQLITE_FCNTL_PRAGMA: case SQLITE_FCNTL_BUSYHANDLER: case SQLITE_FCNTL_TEMPFILENAME:
    case SQLITE_FCNTL_MMAP_SIZE: case SQLITE_FCNTL_HAS_MOVED: case SQLITE_FCNTL_SYNC:
    case SQLITE_FCNTL_COMMIT_PHASETWO: case SQLITE_FCNTL_VFS_POINTER: case SQLITE_FCNTL_JOURNAL_POINTER:
    case SQLITE_FCNTL_PDB: case SQLITE_FCNTL_LOCK_TIMEOUT: case SQLITE_FCNTL_DATA_VERSION:
    case SQLITE_FCNTL_CKPT_START: case SQLITE_FCNTL_CKPT_DONE: case SQLITE_FCNTL_RESERVE_BYTES:
        return 1;
    default:
        return 0;
    }
}

static int cachingFileControl(sqlite3_file *file, int op, void *argument) {
    if (!leavesSizeAlone(op)) forget((CachingFile *)file);
    return REAL(file)->pMethods->xFileControl(REAL(file), op, argument);
}

static int cachingSectorSize(sqlite3_file *file) {
    return REAL(file)->pMethods->xSectorSize(REAL(file));
}

static int cachingDeviceCharacteristics(sqlite3_file *file) {
    return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file));
}

static int cachingShmMap(sqlite3_file *file, int region, int size, int extend, void volatile **mapped) {
    return REAL(file)->pMethods->xShmMap(REAL(file), region, size, extend, mapped);
}

static int cachingShmLock(sqlite3_file *file, int offset, int count, int flags) {
    return REAL(file)->pMethods->xShmLock(REAL(file), offset, count, flags);
}

static void cachingShmBarrier(sqlite3_file *file) {
    REAL(file)->pMethods->xShmBarrier(REAL(file));
}

static int cachingShmUnmap(sqlite3_file *file, int delete) {
    return REAL(file)->pMethods->xShmUnmap(REAL(file), delete);
}

static int cachingFetch(sqlite3_file *file, sqlite3_int64 offset, int amount, void **pointer) {
    return REAL(file)->pMethods->xFetch(REAL(file), offset, amount, pointer);
}

static int cachingUnfetch(sqlite3_file *file, sqlite3_int64 offset, void *pointer) {
    return REAL(file)->pMethods->xUnfetch(REAL(file), offset, pointer);
}

static int cachingOpen(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *outFlags) {
    (void)vfs;
    CachingFile *p = (CachingFile *)file;
    p->real = (sqlite3_file *)&p[1];
    p->lock = SQLITE_LOCK_NONE;
    p->size = -1;
    int rc = underlying->xOpen(underlying, name, p->real, flags, outFlags);
    // SQLite expects pMethods set after xOpen, even when it failed (then xClose is called).
    const sqlite3_io_methods *real = p->real->pMethods;
    p->base.pMethods = real ? &methods[(real->iVersion < 1 ? 1 : real->iVersion > 3 ? 3 : real->iVersion) - 1] : 0;
    return rc;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int registered = SQLITE_ERROR;

static void registerLayer(void) {
    underlying = sqlite3_vfs_find(0);
    if (!underlying) return;
    for (int version = 1; version <= 3; version++) {
        sqlite3_io_methods *m = &methods[version - 1];
        memset(m, 0, sizeof *m);
        m->iVersion = version;
        m->xClose = cachingClose;
        m->xRead = cachingRead;
        m->xWrite = cachingWrite;
        m->xTruncate = cachingTruncate;
        m->xSync = cachingSync;
        m->xFileSize = cachingFileSize;
        m->xLock = cachingLock;
        m->xUnlock = cachingUnlock;
        m->xCheckReservedLock = cachingCheckReservedLock;
        m->xFileControl = cachingFileControl;
        m->xSectorSize = cachingSectorSize;
        m->xDeviceCharacteristics = cachingDeviceCharacteristics;
        if (version >= 2) {
            m->xShmMap = cachingShmMap;
            m->xShmLock = cachingShmLock;
            m->xShmBarrier = cachingShmBarrier;
            m->xShmUnmap = cachingShmUnmap;
        }
        if (version >= 3) {
            m->xFetch = cachingFetch;
            m->xUnfetch = cachingUnfetch;
        }
    }
    // Everything but xOpen and the file size is the underlying VFS's own.
    layer = *underlying;
    layer.zName = "userstore-size-cache";
    layer.szOsFile = (int)sizeof(CachingFile) + underlying->szOsFile;
    layer.xOpen = cachingOpen;
    layer.pNext = 0;
    registered = sqlite3_vfs_register(&layer, 1);
}

int userstore_register_size_cache_vfs(void) {
    pthread_once(&once, registerLayer);
    return registered;
}
