/* What SQLite itself allows a fleet migration on this machine: the statements userstored runs
 * per store (docs/migrations.md "Applying"), from C on N threads, with no daemon around them.
 *
 *   userstore-fleet-floor PATHS MIGRATIONS THREADS [syncfs|fsync]
 *
 * PATHS: a file naming one store per line. MIGRATIONS: the pending migrations' Up SQL, separated
 * by lines of "--;;". Per store: open, exclusive locking, foreign keys off; per migration
 * BEGIN IMMEDIATE, the SQL, PRAGMA foreign_key_check, a schema_migrations row, user_version and
 * the app_version row, COMMIT; then a checkpoint; close. Durable as userstored's fleet run makes
 * them (migrations.fleetSyncMethod): syncfs (the default) commits and checkpoints with
 * synchronous=OFF and waits for a syncfs of the stores' file system, shared by every thread
 * waiting (group commit), before the checkpoint and after it; fsync commits with NORMAL and
 * lets the checkpoint sync the WAL and the database file.
 * Prints one JSON line: stores, seconds, CPU per store, syncfs calls. */
#define _GNU_SOURCE
#include <sqlite3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

static char **paths, *migrations[64];
static int store_count, migration_count;
static atomic_int next_store, failures, syncs;
static int group_commit, sync_descriptor = -1;

/* As FileSystemSync.sync(): returns once a syncfs that began after the call has finished. */
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sync_done = PTHREAD_COND_INITIALIZER;
static unsigned long syncs_started, syncs_finished;
static int sync_running, sync_failed;

static int shared_sync(void) {
    pthread_mutex_lock(&sync_lock);
    unsigned long needed = syncs_started + 1;
    while (syncs_finished < needed) {
        if (sync_running) { pthread_cond_wait(&sync_done, &sync_lock); continue; }
        sync_running = 1;
        unsigned long number = ++syncs_started;
        pthread_mutex_unlock(&sync_lock);
        int failed = syncfs(sync_descriptor) != 0;
        atomic_fetch_add(&syncs, 1);
        pthread_mutex_lock(&sync_lock);
        sync_running = 0;
        syncs_finished = number;
        sync_failed |= failed;
        pthread_cond_broadcast(&sync_done);
    }
    int failed = sync_failed;
    pthread_mutex_unlock(&sync_lock);
    return failed ? -1 : 0;
}

static int run(sqlite3 *db, const char *sql) {
    char *error = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &error) == SQLITE_OK) return 0;
    fprintf(stderr, "%s: %s\n", sql, error ? error : "?");
    sqlite3_free(error);
    return -1;
}

static int migrate(const char *path) {
    sqlite3 *db;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) { sqlite3_close(db); return -1; }
    int failed = run(db, group_commit ? "PRAGMA locking_mode = EXCLUSIVE; PRAGMA synchronous = OFF; PRAGMA foreign_keys = OFF"
                                      : "PRAGMA locking_mode = EXCLUSIVE; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF");
    char sql[512];
    for (int m = 0; m < migration_count && !failed; m++) {
        int version = 1000 + m;
        failed = run(db, "BEGIN IMMEDIATE") || run(db, migrations[m]) || run(db, "PRAGMA foreign_key_check");
        snprintf(sql, sizeof sql,
                 "INSERT INTO schema_migrations (version, name, checksum, applied_at, duration_usec, app_version) "
                 "VALUES (%d, 'm', 'c', strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'), 1, '2.0.0'); PRAGMA user_version = %d; "
                 "UPDATE app_version SET schema_version = %d, updated_at = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now') WHERE id = 1; COMMIT",
                 version, version, version);
        failed = failed || run(db, sql);
    }
    if (group_commit) failed = failed || shared_sync();
    failed = failed || run(db, "PRAGMA wal_checkpoint(PASSIVE)");
    if (group_commit) failed = failed || shared_sync();
    failed = failed || run(db, "PRAGMA foreign_keys = ON");
    return sqlite3_close(db) != SQLITE_OK || failed ? -1 : 0;
}

static void *worker(void *unused) {
    (void)unused;
    for (int i; (i = atomic_fetch_add(&next_store, 1)) < store_count;)
        if (migrate(paths[i])) atomic_fetch_add(&failures, 1);
    return NULL;
}

static char *slurp(const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) { perror(file); exit(2); }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *text = calloc(1, size + 1);
    if (fread(text, 1, size, f) != (size_t)size) { perror(file); exit(2); }
    fclose(f);
    return text;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) { fprintf(stderr, "usage: %s PATHS MIGRATIONS THREADS [syncfs|fsync]\n", argv[0]); return 2; }
    group_commit = argc == 4 || strcmp(argv[4], "fsync") != 0;
    /* As userstored (SQLiteProcessSettings): no process-wide memory count, no bulk page caches. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    sqlite3_config(SQLITE_CONFIG_PAGECACHE, NULL, 0, 0);
    char *list = slurp(argv[1]);
    paths = calloc(strlen(list) + 1, sizeof *paths);
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) paths[store_count++] = line;
    char *text = slurp(argv[2]);
    migrations[migration_count++] = text;
    for (char *mark; (mark = strstr(text, "\n--;;\n")) && migration_count < 64; text = mark + 6) {
        *mark = 0;
        migrations[migration_count++] = mark + 6;
    }
    if (group_commit && store_count > 0) {
        /* The stores' file system: the first store's folder. */
        char *folder = strdup(paths[0]), *slash = strrchr(folder, '/');
        if (slash) *slash = 0;
        if ((sync_descriptor = open(slash ? folder : ".", O_RDONLY | O_DIRECTORY)) < 0) { perror(folder); return 2; }
        free(folder);
    }
    int threads = atoi(argv[3]);
    if (threads < 1 || threads > 256) threads = 1;
    pthread_t ids[256];
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, worker, NULL);
    for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &end);
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    double cpu = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    printf("{\"stores\": %d, \"failures\": %d, \"seconds\": %.3f, \"cpuMicrosecondsPerStore\": %.0f, \"syncfsCalls\": %d}\n",
           store_count, atomic_load(&failures), seconds, store_count ? cpu * 1e6 / store_count : 0, atomic_load(&syncs));
    return atomic_load(&failures) ? 1 : 0;
}
