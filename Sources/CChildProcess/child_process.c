#define _GNU_SOURCE
#include "child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

pid_t us_spawn_tied(const char *path, char *const argv[], char *const envp[], int output_fd) {
    // vfork, as posix_spawn does: no copy of the daemon's page tables per restore. The child
    // shares the parent's memory until execve, so it only makes system calls and writes
    // `child_errno`; every signal stays blocked until its handlers are reset to the defaults
    // (a handler of the daemon's must never run in it).
    volatile int child_errno = 0;
    pid_t parent = getpid();
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pid_t pid = vfork();
    if (pid == 0) {
        struct sigaction defaults = {0};
        defaults.sa_handler = SIG_DFL;
        for (int signal = 1; signal < NSIG; signal++) sigaction(signal, &defaults, NULL);
        // SIGKILL when the thread that started it ends; if the daemon died before this line,
        // the child was already handed to another parent: it must not run at all.
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
            child_errno = ECHILD;
            _exit(127);
        }
        int input = open("/dev/null", O_RDONLY);
        if (input < 0 || dup2(input, 0) < 0 ||
            (output_fd >= 0 && (dup2(output_fd, 1) < 0 || dup2(output_fd, 2) < 0))) {
            child_errno = errno;
            _exit(127);
        }
        // Descriptors the daemon opened without O_CLOEXEC must not reach the child (a store's
        // file, a client's socket). Kernels before 5.11 lack the flag; then only those
        // opened close-on-exec are closed.
        syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
        sigset_t none;
        sigemptyset(&none);
        pthread_sigmask(SIG_SETMASK, &none, NULL);
        execve(path, argv, envp);
        child_errno = errno;
        _exit(127);
    }
    int spawn_errno = errno;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (pid < 0) {
        errno = spawn_errno;
        return -1;
    }
    if (child_errno != 0) {
        // The child exited without executing the program: reap it here.
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        errno = child_errno;
        return -1;
    }
    return pid;
}

int us_wait_for_exit(pid_t pid, int timeout_ms) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return errno == ESRCH ? 1 : -1;
    struct pollfd entry = {.fd = fd, .events = POLLIN};
    int ready;
    do {
        ready = poll(&entry, 1, timeout_ms);
    } while (ready < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    errno = saved;
    return ready < 0 ? -1 : (ready > 0 ? 1 : 0);
}
