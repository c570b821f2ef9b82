import CSQLiteSettings
import CSQLiteSizeCache
import GRDBSQLite

/// SQLite settings that hold for the whole process and must be made before SQLite initialises
/// (its first connection): call ``apply()`` first thing in `main`.
public enum SQLiteProcessSettings {
    /// Whether the settings are in force. False when SQLite was already initialised, or the VFS
    /// layer below could not be registered: correct, only less frugal.
    ///
    /// Page caches start empty rather than with a bulk allocation of 20 pages: with 1,024 small
    /// stores open, those pre-allocations (one for the main database, one for the temp database
    /// a table rebuild uses) were ~175 KiB of each store's ~230 KiB of heap (valgrind massif).
    ///
    /// SQLite keeps no process-wide count of its memory (`SQLITE_CONFIG_MEMSTATUS`): the count
    /// takes one mutex on every allocation, which threads working on different stores queue on
    /// (a fleet migration on 8 threads spent 20% less CPU per store without it).
    ///
    /// The default VFS is a thin layer over SQLite's own that keeps a database's size while its
    /// EXCLUSIVE lock is held (the stores' locking mode) instead of an `fstat` per read
    /// transaction on a store whose WAL is empty (CSQLiteSizeCache; docs/dev/performance-log.md).
    /// Above it, the layer that encrypts the pages of encrypted stores (CSQLiteCipher,
    /// ``PageCipher``); other files pass through it unchanged.
    public static func apply() -> Bool { applied }

    private static let applied: Bool = {
        let configured = userstore_page_cache_without_bulk_allocation() == 0 && userstore_memory_statistics_off() == 0
        // After the configuration: registering a VFS initialises SQLite.
        let layered = userstore_register_size_cache_vfs() == SQLITE_OK
        let encrypting = PageCipher.registerLayer()
        return configured && layered && encrypting
    }()
}

