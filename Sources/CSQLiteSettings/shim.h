#ifndef USERSTORE_SQLITE_SETTINGS_H
#define USERSTORE_SQLITE_SETTINGS_H

#include <malloc.h>
#include <sqlite3.h>

/// sqlite3_config(SQLITE_CONFIG_PAGECACHE, NULL, 0, 0): page caches start empty instead of with
/// a bulk allocation of 20 pages (~87 KiB per cache). Wrapped here because sqlite3_config is
/// variadic, which Swift cannot call. Only works before SQLite initialises (else SQLITE_MISUSE).
static inline int userstore_page_cache_without_bulk_allocation(void) {
    return sqlite3_config(SQLITE_CONFIG_PAGECACHE, (void *)0, 0, 0);
}

/// sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0): no global count of SQLite's memory. With it on,
/// every allocation SQLite makes takes one process-wide mutex, which threads migrating stores
/// side by side queue on (a fleet run: 20% of the CPU per store). Nothing here reads the count.
static inline int userstore_memory_statistics_off(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/// sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL): closing the connection
/// leaves the WAL as it is, even as the last connection, instead of checkpointing it into the
/// database and removing it (variadic, hence wrapped).
static inline int userstore_keep_wal_on_close(sqlite3 *db) {
    return sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)0);
}

/// mallopt(M_ARENA_MAX, count): glibc's malloc.h is not part of Swift's Glibc module.
static inline int userstore_limit_malloc_arenas(int count) {
    return mallopt(M_ARENA_MAX, count);
}

#endif
