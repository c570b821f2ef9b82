#ifndef USERSTORE_UNIX_SOCKET_H
#define USERSTORE_UNIX_SOCKET_H

#include <sys/types.h>

/// recvmsg(2) with room for up to `max_fds` descriptors passed with SCM_RIGHTS (received with
/// MSG_CMSG_CLOEXEC). Returns the bytes read (0 at end of input) or -1 with errno set;
/// `*fd_count` is how many descriptors landed in `fds`. Descriptors beyond `max_fds` (or in a
/// truncated control message) are closed, never leaked.
ssize_t us_recv_with_fds(int socket, void *buffer, size_t length, int *fds, int max_fds, int *fd_count);

/// sendmsg(2) of `length` bytes with `fd_count` descriptors as SCM_RIGHTS (MSG_NOSIGNAL).
/// Returns the bytes sent or -1 with errno set.
ssize_t us_send_with_fds(int socket, const void *buffer, size_t length, const int *fds, int fd_count);

/// SO_PEERCRED: the peer's pid, uid and gid. Returns 0, or -1 with errno set.
int us_peer_credentials(int socket, pid_t *pid, uid_t *uid, gid_t *gid);



#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

/// accept4(2) of a non-blocking, close-on-exec connection. Returns it, or -1 with errno set.
int us_accept(int listener);

/// The number of CPUs this process may run on (sched_getaffinity), at least 1.
int us_cpu_count(void);

/// epoll_ctl(2) with the event's data as a 64-bit token (struct epoll_event is packed on
/// x86-64, which Swift cannot be trusted to lay out). Returns 0, or -1 with errno set.
int us_epoll_ctl(int epoll, int operation, int fd, uint32_t events, uint64_t token);

/// epoll_wait(2) into parallel arrays of tokens and event masks. Returns the count, or -1.
int us_epoll_wait(int epoll, uint64_t *tokens, uint32_t *events, int capacity, int timeout_ms);

/// Names the calling thread for the kernel (ps -L, top -H, perf; at most 15 bytes kept).
void us_set_thread_name(const char *name);
#endif
