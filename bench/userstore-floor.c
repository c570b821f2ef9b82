/*
 * userstore-floor: the machine's limit for a varlink server, measured with the same client.
 *
 * A server that does nothing but answer every NUL-terminated message with a constant one-row
 * reply (the size of userstored's reply to the bench's point query): one thread per core, each
 * with its own epoll loop waiting on the listening socket (EPOLLEXCLUSIVE) and serving the
 * connections it accepts. No parsing, no SQLite, no ordering: what is left is the kernel's
 * part of a request (a wake-up, a recv, a send) — the floor under any server on this machine.
 * scripts/bench.sh builds it; the point-query scenario puts userstored and PostgreSQL beside it.
 *
 * Usage: userstore-floor --socket PATH [--threads N]   (runs until killed)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char reply[] = "{\"parameters\":{\"columns\":[\"value\"],\"rows\":[[\"value 0000000042 of the kv table\"]]}}";
static int listener;

struct connection {
    int fd;
    size_t pending; /* replies owed but not yet written (the socket was full) */
};

/* Writes `count` replies; returns how many the socket did not take (or -1 on an error). */
static long answer(int fd, size_t count) {
    static __thread char batch[64 * sizeof reply];
    const size_t size = sizeof reply; /* with its NUL */
    while (count > 0) {
        size_t n = count < 64 ? count : 64;
        for (size_t i = 0; i < n; i++) memcpy(batch + i * size, reply, size);
        size_t sent = 0, total = n * size;
        while (sent < total) {
            ssize_t w = send(fd, batch + sent, total - sent, MSG_NOSIGNAL);
            if (w > 0) { sent += (size_t)w; continue; }
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                /* The client is not reading: what is owed waits (a partial reply is resent whole:
                   the bench's clients never let it come to that). */
                return (long)(count - sent / size);
            }
            return -1;
        }
        count -= n;
    }
    return 0;
}

static void *serve(void *arg) {
    (void)arg;
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = NULL};
    epoll_ctl(epoll, EPOLL_CTL_ADD, listener, &event);
    struct epoll_event events[64];
    char input[65536];
    for (;;) {
        int ready = epoll_wait(epoll, events, 64, -1);
        for (int e = 0; e < ready; e++) {
            struct connection *c = events[e].data.ptr;
            if (c == NULL) {
                int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) continue;
                c = calloc(1, sizeof *c);
                c->fd = fd;
                struct epoll_event add = {.events = EPOLLIN, .data.ptr = c};
                epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &add);
                continue;
            }
            ssize_t n = recv(c->fd, input, sizeof input, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                close(c->fd);
                free(c);
                continue;
            }
            if (n < 0) continue;
            size_t messages = c->pending;
            for (ssize_t i = 0; i < n; i++) messages += input[i] == 0;
            long left = answer(c->fd, messages);
            if (left < 0) { close(c->fd); free(c); continue; }
            c->pending = (size_t)left;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--socket")) path = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (!path || threads < 1) {
        fprintf(stderr, "usage: userstore-floor --socket PATH [--threads N]\n");
        return 2;
    }
    listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, path, sizeof address.sun_path - 1);
    unlink(path);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(listener, 1024) != 0) {
        fprintf(stderr, "userstore-floor: cannot listen on %s: %s\n", path, strerror(errno));
        return 1;
    }
    pthread_t thread;
    for (int i = 1; i < threads; i++) pthread_create(&thread, NULL, serve, NULL);
    serve(NULL);
    return 0;
}
