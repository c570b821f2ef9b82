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

/// malloc_trim(0): malloc hands every whole free page of its heaps back to the system
/// (madvise), not only the top of the main heap as it does by itself.
static inline int userstore_return_free_pages(void) {
    return malloc_trim(0);
}

/// SQLite's pre-update hook (the change stream's recorder, UserStoreCore/Changes). Debian's
/// libsqlite3 is built with SQLITE_ENABLE_PREUPDATE_HOOK, but sqlite3.h declares these only
/// when the including code defines that macro too, and GRDB's module includes the header
/// first; declared here under names of our own bound to SQLite's symbols (asm labels).
void *userstore_preupdate_hook(sqlite3 *db,
                               void (*callback)(void *context, sqlite3 *db, int operation, char const *schema,
                                                char const *table, sqlite3_int64 old_rowid, sqlite3_int64 new_rowid),
                               void *context) __asm__("sqlite3_preupdate_hook");
int userstore_preupdate_new(sqlite3 *db, int column, sqlite3_value **value) __asm__("sqlite3_preupdate_new");
int userstore_preupdate_count(sqlite3 *db) __asm__("sqlite3_preupdate_count");

#endif
