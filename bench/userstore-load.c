/*
 * userstore-load: a lean varlink load generator for userstored, built like pgbench drives
 * PostgreSQL (-c connections -j threads): each thread multiplexes its share of the connections
 * with epoll; a connection keeps `pipeline` calls in flight (1 = wait for each reply, as
 * pgbench does) and sends the next one as soon as a reply arrives. Replies are only checked for
 * being a success ({"parameters" ...}); nothing is parsed on the measuring path.
 *
 * Built by scripts/bench.sh with the system C compiler. Prints one JSON object:
 *   {"requests": N, "errors": N, "seconds": S, "throughput": R, "p50_us": X, "p99_us": Y,
 *    "client_cpu_us_per_request": C}
 *
 * usage: userstore-load --socket PATH [--connections 8] [--threads 2] [--seconds 5]
 *          [--pipeline 1] [--batch 0|1]  (1: send the pipeline's calls in one write, wait for all
 *                                           their replies, then the next batch: pgbench's
 *                                           pipeline mode; 0: refill each slot as its reply comes)
 *          [--users 1000] [--user-format u%05d] [--pick random|connection]
 *          [--method io.userstore.Store.Query] [--sql "SELECT value FROM kv WHERE id = ?"]
 *          [--rows 10000]  (a random id in 1..rows is the one parameter; 0: no parameter)
 *          [--durable 0|1]  (1: each call asks for a durable reply: `"durable": true`)
 *          [--rate R]  (at most R calls per second in all, paced evenly; 0 = as fast as replies
 *                       come. Latency is timed from each call's actual send. Implies --pipeline 1)
 *          [--tpcb ACCOUNTS]  (instead: pgbench's TPC-B-like transaction on each connection's own
 *                              user, one call at a time: Begin, UPDATE accounts, SELECT, UPDATE
 *                              tellers, UPDATE branches, INSERT history, Commit; a request is a
 *                              whole transaction)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *socket_path;
static int connections = 8, threads = 2, pipeline_depth = 1, users = 1000, rows = 10000, durable = 0;
/* --batch: a connection sends its `pipeline` calls in one write and waits for all their replies
   before the next batch, as pgbench's pipeline mode (\startpipeline ... \endpipeline) does;
   without it, each reply's slot is refilled as soon as the reply arrives (a sliding window). */
static int batch_mode = 0;
static double seconds = 5;
static const char *user_format = "u%05d";
static const char *method = "io.userstore.Store.Query";
static const char *sql = "SELECT value FROM kv WHERE id = ?";
static int pick_random_user = 1;
static int tpcb_accounts = 0;
static double rate = 0;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* SplitMix64: cheap, seedable. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct connection {
    int fd;
    int index;
    /* TPC-B mode: the call of the transaction to send next (0 = Begin), its id and values. */
    int step;
    char transaction[64];
    long aid, tid, bid, delta;
    uint64_t began;
    uint64_t *sent_at; /* ring of pipeline_depth send times */
    int head, in_flight;
    char in[1 << 16];
    size_t in_used;
    int dead;
};

struct worker {
    pthread_t thread;
    int id;
    struct connection *conns;
    int count;
    uint64_t *samples;
    size_t samples_used, samples_capacity;
    uint64_t errors;
    uint64_t random;
    /* --rate: the earliest time of the next call, the gap between calls, connections waiting. */
    uint64_t next_slot, interval;
    struct connection **waiting;
    int waiting_head, waiting_count;
};

static pthread_barrier_t start_barrier;
static uint64_t deadline;

static void record(struct worker *w, uint64_t sample) {
    if (w->samples_used == w->samples_capacity) {
        w->samples_capacity = w->samples_capacity ? w->samples_capacity * 2 : 1 << 20;
        w->samples = realloc(w->samples, w->samples_capacity * sizeof(uint64_t));
        if (!w->samples) { perror("realloc"); exit(2); }
    }
    w->samples[w->samples_used++] = sample;
}

/* The next call of connection `c`'s TPC-B-like transaction. */
static int build_tpcb(struct worker *w, struct connection *c, char *out, size_t size) {
    char user[160];
    snprintf(user, sizeof user, user_format, c->index % users);
    int n = 0;
    switch (c->step) {
    case 0:
        c->aid = (long)(next_random(&w->random) % (uint64_t)tpcb_accounts) + 1;
        c->tid = (long)(next_random(&w->random) % 10) + 1;
        c->bid = 1;
        c->delta = (long)(next_random(&w->random) % 10001) - 5000;
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Begin\",\"parameters\":{\"user\":\"%s\"}}", user);
        break;
    case 1:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Execute\",\"parameters\":{\"user\":\"%s\",\"transaction\":\"%s\","
                     "\"sql\":\"UPDATE accounts SET abalance = abalance + ? WHERE aid = ?\",\"parameters\":[%ld,%ld]}}", user, c->transaction, c->delta, c->aid);
        break;
    case 2:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Query\",\"parameters\":{\"user\":\"%s\",\"transaction\":\"%s\","
                     "\"sql\":\"SELECT abalance FROM accounts WHERE aid = ?\",\"parameters\":[%ld]}}", user, c->transaction, c->aid);
        break;
    case 3:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Execute\",\"parameters\":{\"user\":\"%s\",\"transaction\":\"%s\","
                     "\"sql\":\"UPDATE tellers SET tbalance = tbalance + ? WHERE tid = ?\",\"parameters\":[%ld,%ld]}}", user, c->transaction, c->delta, c->tid);
        break;
    case 4:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Execute\",\"parameters\":{\"user\":\"%s\",\"transaction\":\"%s\","
                     "\"sql\":\"UPDATE branches SET bbalance = bbalance + ? WHERE bid = ?\",\"parameters\":[%ld,%ld]}}", user, c->transaction, c->delta, c->bid);
        break;
    case 5:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Execute\",\"parameters\":{\"user\":\"%s\",\"transaction\":\"%s\","
                     "\"sql\":\"INSERT INTO history (tid, bid, aid, delta, mtime) VALUES (?, ?, ?, ?, CURRENT_TIMESTAMP)\","
                     "\"parameters\":[%ld,%ld,%ld,%ld]}}", user, c->transaction, c->tid, c->bid, c->aid, c->delta);
        break;
    default:
        n = snprintf(out, size, "{\"method\":\"io.userstore.Store.Commit\",\"parameters\":{\"transaction\":\"%s\"}}", c->transaction);
    }
    out[n] = 0;
    return n + 1;
}

static int build_request(struct worker *w, struct connection *c, char *out, size_t size) {
    if (tpcb_accounts > 0) return build_tpcb(w, c, out, size);
    char user[160];
    int u = pick_random_user ? (int)(next_random(&w->random) % (uint64_t)users) : c->index % users;
    snprintf(user, sizeof user, user_format, u);
    int n;
    if (rows > 0) {
        long id = (long)(next_random(&w->random) % (uint64_t)rows) + 1;
        n = snprintf(out, size, "{\"method\":\"%s\",\"parameters\":{\"user\":\"%s\",\"sql\":\"%s\",\"parameters\":[%ld]%s}}",
                     method, user, sql, id, durable ? ",\"durable\":true" : "");
    } else {
        n = snprintf(out, size, "{\"method\":\"%s\",\"parameters\":{\"user\":\"%s\",\"sql\":\"%s\"%s}}", method, user, sql,
                     durable ? ",\"durable\":true" : "");
    }
    out[n] = 0; /* the varlink frame terminator */
    return n + 1;
}

/* Fills the connection's pipeline; false when the socket failed. */
static int top_up(struct worker *w, struct connection *c) {
    char batch[16384];
    size_t used = 0;
    uint64_t t = now_ns();
    while (c->in_flight < pipeline_depth && used + 1024 < sizeof batch) {
        used += (size_t)build_request(w, c, batch + used, sizeof batch - used);
        c->sent_at[(c->head + c->in_flight) % pipeline_depth] = t;
        c->in_flight++;
    }
    size_t sent = 0;
    while (sent < used) {
        ssize_t n = send(c->fd, batch + sent, used - sent, MSG_NOSIGNAL);
        if (n <= 0) { if (n < 0 && errno == EINTR) continue; return 0; }
        sent += (size_t)n;
    }
    return 1;
}

/* Sends the connection's next call now, or (--rate) when its slot comes. False when the socket failed. */
static int send_or_wait(struct worker *w, struct connection *c, uint64_t t) {
    if (w->interval == 0) return top_up(w, c);
    if (w->waiting_count > 0 || t < w->next_slot) {
        w->waiting[(w->waiting_head + w->waiting_count++) % w->count] = c;
        return 1;
    }
    if (w->next_slot + 50000000ull < t) w->next_slot = t; /* fell behind: no catch-up burst */
    w->next_slot += w->interval;
    return top_up(w, c);
}

/* --rate: sends the waiting connections whose slots have come. */
static void send_due(struct worker *w, int *live) {
    uint64_t t = now_ns();
    while (w->waiting_count > 0 && t >= w->next_slot) {
        struct connection *c = w->waiting[w->waiting_head];
        w->waiting_head = (w->waiting_head + 1) % w->count;
        w->waiting_count--;
        if (w->next_slot + 50000000ull < t) w->next_slot = t;
        w->next_slot += w->interval;
        if (!c->dead && !top_up(w, c)) { c->dead = 1; w->errors++; (*live)--; }
    }
}

/* epoll_wait's timeout: until the next slot when connections wait for one. */
static int wait_ms(struct worker *w) {
    if (w->waiting_count == 0) return 100;
    uint64_t t = now_ns();
    if (t >= w->next_slot) return 0;
    uint64_t ms = (w->next_slot - t + 999999) / 1000000;
    return ms > 100 ? 100 : (int)ms;
}

static void *run_worker(void *arg) {
    struct worker *w = arg;
    int epoll = epoll_create1(0);
    for (int i = 0; i < w->count; i++) {
        struct connection *c = &w->conns[i];
        struct epoll_event event = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(epoll, EPOLL_CTL_ADD, c->fd, &event);
    }
    pthread_barrier_wait(&start_barrier);
    int live = w->count;
    w->next_slot = now_ns();
    for (int i = 0; i < w->count; i++)
        if (!send_or_wait(w, &w->conns[i], now_ns())) { w->conns[i].dead = 1; w->errors++; live--; }
    struct epoll_event events[64];
    while (live > 0) {
        int ready = epoll_wait(epoll, events, 64, wait_ms(w));
        uint64_t t = now_ns();
        if (t >= deadline) break;
        if (ready < 0) { if (errno == EINTR) continue; break; }
        if (w->interval) send_due(w, &live);
        for (int e = 0; e < ready; e++) {
            struct connection *c = events[e].data.ptr;
            if (c->dead) continue;
            ssize_t n = recv(c->fd, c->in + c->in_used, sizeof c->in - c->in_used, 0);
            if (n <= 0) { c->dead = 1; w->errors++; live--; continue; }
            c->in_used += (size_t)n;
            t = now_ns();
            size_t start = 0;
            for (size_t i = 0; i < c->in_used; i++) {
                if (c->in[i] != 0) continue;
                int ok = strncmp(c->in + start, "{\"parameters\"", 13) == 0;
                if (tpcb_accounts > 0) {
                    /* One transaction is one request: timed from Begin to Commit. */
                    if (c->step == 0) {
                        c->began = c->sent_at[c->head];
                        char *id = ok ? strstr(c->in + start, "\"transaction\":\"") : NULL;
                        char *end = id ? strchr(id + 15, '"') : NULL;
                        if (!id || !end || end - id - 15 >= (long)sizeof c->transaction) { w->errors++; c->step = -1; }
                        else { memcpy(c->transaction, id + 15, (size_t)(end - id - 15)); c->transaction[end - id - 15] = 0; }
                    } else if (!ok) {
                        w->errors++;
                        c->step = c->step < 6 ? 5 : -1; /* a failed statement: still end the transaction */
                    }
                    if (c->step == 6) record(w, t - c->began);
                    c->step = c->step >= 6 || c->step < 0 ? 0 : c->step + 1;
                } else {
                    if (!ok) w->errors++;
                    record(w, t - c->sent_at[c->head]);
                }
                c->head = (c->head + 1) % pipeline_depth;
                c->in_flight--;
                start = i + 1;
            }
            if (start > 0) {
                memmove(c->in, c->in + start, c->in_used - start);
                c->in_used -= start;
            } else if (c->in_used == sizeof c->in) {
                fprintf(stderr, "userstore-load: a reply larger than %zu bytes\n", sizeof c->in);
                exit(2);
            }
            /* Refill the pipeline (with --rate, depth 1: wait for the next slot). */
            if (batch_mode && c->in_flight > 0) continue; /* the batch's replies are not all in */
            if (t < deadline && !(c->in_flight == 0 ? send_or_wait(w, c, t) : top_up(w, c))) { c->dead = 1; w->errors++; live--; }
        }
    }
    close(epoll);
    return NULL;
}

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double cpu_us(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec + usage.ru_stime.tv_sec * 1e6 + usage.ru_stime.tv_usec;
}

static int connect_socket(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, socket_path, sizeof address.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        fprintf(stderr, "userstore-load: cannot connect to %s: %s\n", socket_path, strerror(errno));
        exit(2);
    }
    return fd;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *key = argv[i], *value = argv[i + 1];
        if (!strcmp(key, "--socket")) socket_path = value;
        else if (!strcmp(key, "--connections")) connections = atoi(value);
        else if (!strcmp(key, "--threads")) threads = atoi(value);
        else if (!strcmp(key, "--seconds")) seconds = atof(value);
        else if (!strcmp(key, "--pipeline")) pipeline_depth = atoi(value);
        else if (!strcmp(key, "--batch")) batch_mode = atoi(value);
        else if (!strcmp(key, "--users")) users = atoi(value);
        else if (!strcmp(key, "--user-format")) user_format = value;
        else if (!strcmp(key, "--pick")) pick_random_user = strcmp(value, "connection") != 0;
        else if (!strcmp(key, "--method")) method = value;
        else if (!strcmp(key, "--sql")) sql = value;
        else if (!strcmp(key, "--rows")) rows = atoi(value);
        else if (!strcmp(key, "--rate")) rate = atof(value);
        else if (!strcmp(key, "--durable")) durable = atoi(value);
        else if (!strcmp(key, "--tpcb")) { tpcb_accounts = atoi(value); pick_random_user = 0; }
        else { fprintf(stderr, "userstore-load: unknown option %s\n", key); return 2; }
    }
    if (!socket_path || connections < 1 || threads < 1 || pipeline_depth < 1 || users < 1) {
        fprintf(stderr, "usage: userstore-load --socket PATH [--connections N] [--threads N] [--seconds S] [--pipeline N] ...\n");
        return 2;
    }
    if (threads > connections) threads = connections;
    if (rate > 0) pipeline_depth = 1;
    struct worker *workers = calloc((size_t)threads, sizeof *workers);
    for (int t = 0; t < threads; t++) {
        struct worker *w = &workers[t];
        w->id = t;
        w->random = 7919ull * (uint64_t)(t + 1);
        for (int c = t; c < connections; c += threads) w->count++;
        w->conns = calloc((size_t)w->count, sizeof *w->conns);
        w->waiting = calloc((size_t)w->count, sizeof *w->waiting);
        w->interval = rate > 0 ? (uint64_t)(1e9 * threads / rate) : 0;
        int slot = 0;
        for (int c = t; c < connections; c += threads, slot++) {
            w->conns[slot].fd = connect_socket();
            w->conns[slot].index = c;
            w->conns[slot].sent_at = calloc((size_t)pipeline_depth, sizeof(uint64_t));
        }
    }
    pthread_barrier_init(&start_barrier, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) pthread_create(&workers[t].thread, NULL, run_worker, &workers[t]);
    double cpu_before = cpu_us();
    uint64_t begin = now_ns();
    deadline = begin + (uint64_t)(seconds * 1e9);
    pthread_barrier_wait(&start_barrier);
    for (int t = 0; t < threads; t++) pthread_join(workers[t].thread, NULL);
    double elapsed = (double)(now_ns() - begin) / 1e9;
    double cpu = cpu_us() - cpu_before;

    size_t total = 0;
    uint64_t errors = 0;
    for (int t = 0; t < threads; t++) { total += workers[t].samples_used; errors += workers[t].errors; }
    uint64_t *all = malloc((total ? total : 1) * sizeof(uint64_t));
    size_t at = 0;
    for (int t = 0; t < threads; t++) {
        memcpy(all + at, workers[t].samples, workers[t].samples_used * sizeof(uint64_t));
        at += workers[t].samples_used;
    }
    qsort(all, total, sizeof(uint64_t), compare);
#define PERCENTILE(q) (total ? all[(size_t)(total * (q))] / 1e3 : 0)
    printf("{\"requests\": %zu, \"errors\": %llu, \"seconds\": %.3f, \"throughput\": %.1f, \"p50_us\": %.1f, \"p90_us\": %.1f, "
           "\"p99_us\": %.1f, \"p999_us\": %.1f, \"client_cpu_us_per_request\": %.2f}\n",
           total, (unsigned long long)errors, elapsed, total / elapsed, PERCENTILE(0.50), PERCENTILE(0.90), PERCENTILE(0.99),
           PERCENTILE(0.999), total ? cpu / (double)total : 0);
    return 0;
}
