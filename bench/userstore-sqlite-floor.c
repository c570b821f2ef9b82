/*
 * userstore-sqlite-floor: what SQLite alone costs per point query with one file per user.
 *
 * Opens STORES SQLite files (created with ROWS rows of kv if missing) with the daemon's
 * connection settings (exclusive locking set before the first read, WAL, synchronous=FULL), prepares the bench's point
 * query once per store, warms each store's pages, then runs THREADS threads for SECONDS: each
 * picks a random store and a random id, binds, steps, copies the value out and resets. No
 * socket, no JSON, no scheduling: the least a server that runs one SQLite query per request on
 * these files can spend, and with it, how far up a point-query rate can go on this machine.
 *
 * --partition gives each thread its own share of the stores (store % THREADS == thread), so
 * each core's caches hold only its share: an upper bound. Without it every thread picks from all
 * stores under a mutex per store, as the daemon's event loops do.
 *
 * --files LIST runs on existing stores instead (one path per line, each with a kv table of
 * ROWS rows): the bench points it at the very files userstored served a moment before.
 *
 * Prints one JSON line: {"throughput": queries/s, "cpu_us": CPU µs per query (process)}.
 * Usage: userstore-sqlite-floor (--dir D [--stores 100] | --files LIST) [--rows 10000]
 *                               [--threads 2] [--seconds 5] [--partition]
 * Build: cc -O2 -pthread -o userstore-sqlite-floor bench/userstore-sqlite-floor.c -lsqlite3
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct store {
    sqlite3 *db;
    sqlite3_stmt *query;
    pthread_mutex_t lock;
};

static struct store *stores;
static int store_count = 100, rows = 10000, threads = 2, partition = 0;
static double seconds = 5;
static atomic_int stop;

static void check(int rc, sqlite3 *db, const char *what) {
    if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return;
    fprintf(stderr, "userstore-sqlite-floor: %s: %s\n", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    exit(1);
}

static void open_store(const char *path, int index) {
    struct stat st;
    int exists = stat(path, &st) == 0;
    struct store *s = &stores[index];
    check(sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL), NULL, path);
    check(sqlite3_exec(s->db, "PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL", NULL, NULL, NULL), s->db, "pragmas");
    if (!exists) {
        char sql[512];
        snprintf(sql, sizeof sql,
                 "CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL);"
                 "INSERT INTO kv (id, value) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < %d)"
                 " SELECT x, 'value ' || x FROM c;", rows);
        check(sqlite3_exec(s->db, sql, NULL, NULL, NULL), s->db, "create");
    }
    check(sqlite3_exec(s->db, "SELECT sum(length(value)) FROM kv", NULL, NULL, NULL), s->db, "warm");
    check(sqlite3_prepare_v3(s->db, "SELECT value FROM kv WHERE id = ?", -1, SQLITE_PREPARE_PERSISTENT, &s->query, NULL), s->db, "prepare");
    pthread_mutex_init(&s->lock, NULL);
}

static uint64_t next(uint64_t *state) { /* xorshift64* */
    *state ^= *state >> 12; *state ^= *state << 25; *state ^= *state >> 27;
    return *state * 2685821657736338717ULL;
}

static void *run(void *arg) {
    long thread = (long)arg;
    uint64_t state = 104729ULL * (uint64_t)(thread + 1), count = 0;
    char value[256];
    int own = partition ? (store_count - (int)thread + threads - 1) / threads : store_count;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        int pick = (int)(next(&state) % (uint64_t)own);
        int index = partition ? pick * threads + (int)thread : pick;
        struct store *s = &stores[index];
        if (!partition) pthread_mutex_lock(&s->lock);
        sqlite3_bind_int64(s->query, 1, (sqlite3_int64)(next(&state) % (uint64_t)rows) + 1);
        if (sqlite3_step(s->query) == SQLITE_ROW) {
            const unsigned char *text = sqlite3_column_text(s->query, 0);
            int size = sqlite3_column_bytes(s->query, 0);
            memcpy(value, text, size < (int)sizeof value ? (size_t)size : sizeof value);
            count++;
        }
        sqlite3_reset(s->query);
        if (!partition) pthread_mutex_unlock(&s->lock);
    }
    return (void *)(uintptr_t)count;
}

static double cpu_seconds(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

/* The paths of --files, one per line; sets store_count. */
static char **read_list(const char *list) {
    FILE *file = fopen(list, "r");
    if (!file) { perror(list); exit(1); }
    char **paths = NULL, line[4096];
    int count = 0;
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        struct stat st;
        if (stat(line, &st) != 0) { fprintf(stderr, "userstore-sqlite-floor: %s: no such store\n", line); exit(1); }
        paths = realloc(paths, (size_t)(count + 1) * sizeof *paths);
        paths[count++] = strdup(line);
    }
    fclose(file);
    store_count = count;
    return paths;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *list = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--files") && i + 1 < argc) list = argv[++i];
        else if (!strcmp(argv[i], "--stores") && i + 1 < argc) store_count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--partition")) partition = 1;
        else { fprintf(stderr, "usage: %s (--dir D [--stores N] | --files LIST) [--rows N] [--threads N] [--seconds S] [--partition]\n", argv[0]); return 2; }
    }
    char **paths = list ? read_list(list) : NULL;
    if ((!dir == !list) || store_count < 1 || rows < 1 || threads < 1 || threads > store_count) {
        fprintf(stderr, "userstore-sqlite-floor: one of --dir and --files is required; stores, --rows and --threads must be ≥ 1, threads ≤ stores\n");
        return 2;
    }
    if (dir) mkdir(dir, 0755);
    stores = calloc((size_t)store_count, sizeof *stores);
    for (int i = 0; i < store_count; i++) {
        char path[4096];
        if (paths) snprintf(path, sizeof path, "%s", paths[i]);
        else snprintf(path, sizeof path, "%s/store-%05d.sqlite", dir, i);
        open_store(path, i);
    }

    pthread_t ids[threads];
    struct timespec start, end;
    double cpu = cpu_seconds();
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long t = 0; t < threads; t++) pthread_create(&ids[t], NULL, run, (void *)t);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&stop, 1);
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) { void *count; pthread_join(ids[t], &count); total += (uint64_t)(uintptr_t)count; }
    clock_gettime(CLOCK_MONOTONIC, &end);
    cpu = cpu_seconds() - cpu;
    double elapsed = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("{\"throughput\": %.1f, \"cpu_us\": %.2f, \"stores\": %d, \"threads\": %d, \"partition\": %s}\n",
           total / elapsed, total ? cpu * 1e6 / (double)total : 0, store_count, threads, partition ? "true" : "false");
    for (int i = 0; i < store_count; i++) { sqlite3_finalize(stores[i].query); sqlite3_close(stores[i].db); }
    return 0;
}
