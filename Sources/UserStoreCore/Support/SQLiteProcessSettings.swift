import CSQLiteSettings
import Foundation

/// SQLite settings that hold for the whole process and must be made before SQLite initialises
/// (its first connection): call ``apply()`` first thing in `main`.
public enum SQLiteProcessSettings {
    /// Whether the settings are in force. False when SQLite was already initialised: correct,
    /// only less frugal.
    ///
    /// Page caches start empty rather than with a bulk allocation of 20 pages: with 1,024 small
    /// stores open, those pre-allocations (one for the main database, one for the temp database
    /// a table rebuild uses) were ~175 KiB of each store's ~230 KiB of heap (valgrind massif).
    public static func apply() -> Bool { applied }

    private static let applied: Bool = userstore_page_cache_without_bulk_allocation() == 0
}

/// Process-wide malloc settings for the daemon.
public enum MallocSettings {
    /// Caps glibc's malloc arenas at one per core (at least 2) unless `MALLOC_ARENA_MAX` is set.
    /// Its default (8 per core) let RSS climb by tens of MiB with each fleet migration run under
    /// load and never give it back: threads that allocated at the same time got arenas of their
    /// own, each growing to the working set. Capped, the same runs stay flat
    /// (docs/reliability.md, Soak). Call before most threads exist.
    public static func limitArenas(cores: Int) {
        guard getenv("MALLOC_ARENA_MAX") == nil else { return }
        _ = userstore_limit_malloc_arenas(Int32(max(2, cores)))
    }
}
