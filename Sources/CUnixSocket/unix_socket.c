#define _GNU_SOURCE
#include "unix_socket.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_PASSED_FDS = 16 };

ssize_t us_recv_with_fds(int socket, void *buffer, size_t length, int *fds, int max_fds, int *fd_count) {
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS)];
    } control;
    struct iovec vector = {.iov_base = buffer, .iov_len = length};
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.bytes, .msg_controllen = sizeof control.bytes};
    *fd_count = 0;
    ssize_t received = recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (received < 0) return received;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *passed = (int *)CMSG_DATA(header);
        for (size_t index = 0; index < count; index++) {
            if (*fd_count < max_fds) fds[(*fd_count)++] = passed[index];
            else close(passed[index]);
        }
    }
    return received;
}

ssize_t us_send_with_fds(int socket, const void *buffer, size_t length, const int *fds, int fd_count) {
    if (fd_count < 0 || fd_count > MAX_PASSED_FDS) { errno = EINVAL; return -1; }
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * MAX_PASSED_FDS)];
    } control;
    memset(&control, 0, sizeof control);
    struct iovec vector = {.iov_base = (void *)buffer, .iov_len = length};
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1};
    if (fd_count > 0) {
        message.msg_control = control.bytes;
        message.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)fd_count);
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)fd_count);
        memcpy(CMSG_DATA(header), fds, sizeof(int) * (size_t)fd_count);
    }
    return sendmsg(socket, &message, MSG_NOSIGNAL);
}

int us_peer_credentials(int socket, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t size = sizeof credentials;
    if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return -1;
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

#include <sys/epoll.h>

int us_epoll_ctl(int epoll, int operation, int fd, uint32_t events, uint64_t token) {
    struct epoll_event event = {.events = events, .data.u64 = token};
    return epoll_ctl(epoll, operation, fd, &event);
}

int us_epoll_wait(int epoll, uint64_t *tokens, uint32_t *events, int capacity, int timeout_ms) {
    struct epoll_event ready[64];
    if (capacity > 64) capacity = 64;
    int count = epoll_wait(epoll, ready, capacity, timeout_ms);
    for (int index = 0; index < count; index++) {
        tokens[index] = ready[index].data.u64;
        events[index] = ready[index].events;
    }
    return count;
}

#include <sched.h>

int us_accept(int listener) {
    return accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

int us_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    int count = CPU_COUNT(&set);
    return count > 0 ? count : 1;
}

void us_set_thread_name(const char *name) {
    char truncated[16];
    strncpy(truncated, name, sizeof truncated - 1);
    truncated[sizeof truncated - 1] = 0;
    pthread_setname_np(pthread_self(), truncated);
}
