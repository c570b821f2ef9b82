/// Everything a ``StoreRegistry`` needs to know, frozen before it starts.
public struct RegistryConfiguration: Sendable {
    /// Where the stores live.
    public var layout: StoreLayout
    /// The app version recorded in the stores this registry opens or migrates.
    public var appVersion: AppVersion
    /// At most this many store files are open at once (least recently used closed first).
    public var maxOpenStores: Int
    /// A store unused for this long is closed by ``StoreRegistry/closeIdleStores(now:)``.
    public var idleTimeout: Duration
    /// An open store unused for this long hands its page cache back
    /// (``StoreRegistry/releaseIdleMemory(idleFor:now:)``, the daemon's free-page returner);
    /// nil: never.
    public var cacheIdle: Duration? = .seconds(1)
    /// How migrations treat the unusual cases.
    public var policy: MigrationPolicy
    /// How long a statement waits for a lock held by another process.
    public var busyTimeoutSeconds: Double
    /// Whether stores record their committed changes for watchers, and how much they keep
    /// (nil: no change stream, the default; `watch.enabled`).
    public var changeRetention: ChangeRetention? = nil
    /// Encrypts every store with its user's data key (docs/encryption.md); nil: plaintext.
    public var keyring: StoreKeyring? = nil

    public init(layout: StoreLayout, appVersion: AppVersion, maxOpenStores: Int = 1024,
                idleTimeout: Duration = .seconds(300), policy: MigrationPolicy = MigrationPolicy(),
                busyTimeoutSeconds: Double = 5) {
        precondition(maxOpenStores >= 1, "maxOpenStores must be at least 1")
        self.layout = layout
        self.appVersion = appVersion
        self.maxOpenStores = maxOpenStores
        self.idleTimeout = idleTimeout
        self.policy = policy
        self.busyTimeoutSeconds = busyTimeoutSeconds
    }
}

/// Counters of a registry, for status displays.
public struct RegistryStatistics: Sendable, Equatable {
    /// Store files open (or being opened or closed) right now.
    public var openStores: Int
    /// The most that were ever open at once.
    public var peakOpenStores: Int
    /// Stores being opened and migrated right now.
    public var preparing: Int
    /// Open stores whose last migration failed or that were refused.
    public var failedStores: Int
    /// Requests holding a store right now.
    public var leases: Int
    /// Migration runs that applied at least one migration since start.
    public var migrationRuns: Int
    /// Generation of the migration set (bumped by each reload).
    public var generation: Int
}
