#ifndef USERSTORE_SYNCFS_H
#define USERSTORE_SYNCFS_H

/// syncfs(2), in glibc since 2.14: declared by <unistd.h> only under _GNU_SOURCE, which Swift's
/// Glibc module is not built with. Writes back every dirty page and inode of the file system
/// holding `fd` and waits for them (and, since Linux 5.8, reports a writeback error once per
/// open file description).
int syncfs(int fd);

#endif
