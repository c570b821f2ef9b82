import CSQLiteSettings
import Foundation

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

    /// Hands every whole free page of malloc's heaps back to the system (`malloc_trim`). glibc
    /// returns only the top of its main heap by itself; a daemon that opens and closes stores
    /// all day frees their caches in the middle of its heaps, where the pages stay resident.
    /// Takes each heap's lock in turn while it walks the heap's free chunks.
    public static func returnFreePages() {
        _ = userstore_return_free_pages()
    }
}
