#ifndef USERSTORE_CHILD_PROCESS_H
#define USERSTORE_CHILD_PROCESS_H

#include <sys/types.h>

/// Starts the program at `path` (argv and envp NULL-terminated) as a child process that the
/// kernel sends SIGKILL when the *calling thread* ends (prctl PR_SET_PDEATHSIG). Call it from a
/// thread that lives as long as the process, and the child never outlives the daemon, however
/// the daemon ends (SIGKILL included). The child stays in the caller's process group, reads
/// /dev/null, writes to `output_fd` (stdout and stderr; inherited when -1), starts with no
/// signal blocked and every disposition at its default, and gets no descriptor above 2.
///
/// Returns the child's pid, or -1 with errno set (also when the program could not be executed:
/// the child reports execve's errno before it exits).
pid_t us_spawn_tied(const char *path, char *const argv[], char *const envp[], int output_fd);

/// Waits up to `timeout_ms` milliseconds for process `pid` (any process, not only a child) to
/// end, without reaping it (pidfd_open and poll). Returns 1 when it has ended or does not
/// exist, 0 when it still runs, -1 with errno set.
int us_wait_for_exit(pid_t pid, int timeout_ms);

#endif
