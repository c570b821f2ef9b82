#ifndef USERSTORE_SQLITE_SIZE_CACHE_H
#define USERSTORE_SQLITE_SIZE_CACHE_H

/// Registers, as SQLite's default VFS, a thin layer over the platform's default ("unix") that
/// remembers a file's size while this process holds the file's EXCLUSIVE lock, instead of
/// asking the kernel (`fstat`) again. Returns an SQLite result code; later calls do nothing and
/// return what the first returned.
///
/// Why: in WAL mode, a read transaction on a database whose WAL holds no frame (a store read
/// but not written since it was opened) learns the database's size from `xFileSize`, an
/// `fstat` per statement — 5-8% of the daemon's CPU on such stores (docs/dev/performance-log.md).
/// With `locking_mode = EXCLUSIVE` (how the daemon opens its stores) the lock is held from the
/// first read to the close, and nothing but this connection's own writes and truncations,
/// which the layer follows, can change the file: SQLite's locks keep every other SQLite
/// connection out. Without the EXCLUSIVE lock (replication's normal locking mode, journals, WAL
/// files), every call goes through unchanged.
int userstore_register_size_cache_vfs(void);

#endif
