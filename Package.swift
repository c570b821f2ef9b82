// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "userstore",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "userstored", targets: ["userstored"]),
        .executable(name: "userstorectl", targets: ["userstorectl"]),
        .library(name: "UserStoreCore", targets: ["UserStoreCore"]),
        .library(name: "Varlink", targets: ["Varlink"]),
        .library(name: "UserStoreClient", targets: ["UserStoreClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-configuration", from: "1.4.0", traits: [.defaults, "YAML"]),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
    ],
    targets: [
        // The store engine: user IDs, paths, migrations, bookkeeping, the registry of open stores.
        .target(
            name: "UserStoreCore",
            dependencies: [
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                "CSQLiteSettings",
                "CSQLiteSizeCache",
                "CSQLiteCipher",
                "CSyncFS",
                "VarlinkJSON",
            ]
        ),
        // A VFS layer that keeps a database's size while its EXCLUSIVE lock is held, instead of
        // an fstat per read transaction on a store whose WAL is empty (docs/dev/performance-log.md).
        .target(name: "CSQLiteSizeCache", dependencies: [.product(name: "GRDBSQLite", package: "GRDB.swift")]),
        // A VFS layer that encrypts the pages of the stores given a key, and of their WALs, and
        // the page format with AES-256-GCM from Debian's OpenSSL libcrypto (libssl-dev), a
        // context kept per key: docs/encryption.md.
        .target(name: "CSQLiteCipher", dependencies: [.product(name: "GRDBSQLite", package: "GRDB.swift")],
                linkerSettings: [.linkedLibrary("crypto")]),
        // sqlite3_config (variadic, so not callable from Swift): process-wide SQLite memory settings.
        .systemLibrary(name: "CSQLiteSettings", providers: [.apt(["libsqlite3-dev"])]),
        // syncfs(2) (glibc declares it only under _GNU_SOURCE): a fleet run's group commit.
        .systemLibrary(name: "CSyncFS"),
        // Exact JSON: a tape parser that reads in place, values, a writer (the store engine's
        // change events use it without the socket and loop code).
        .target(name: "VarlinkJSON"),
        // The varlink protocol: framing, messages, the epoll event loop daemon and client share
        // (re-exports VarlinkJSON: its messages are that JSON).
        .target(name: "Varlink", dependencies: ["CUnixSocket", "VarlinkJSON"]),
        // The names of the daemon's methods and errors, one table for the daemon, the client and
        // userstorectl (no dependencies: the client links it too).
        .target(name: "UserStoreInterface"),
        // The Swift client applications import: a pipelining connection pool on the daemon's own
        // epoll loop (Varlink's EventLoop) and NIOCore's data structures (it depends on neither
        // GRDB nor the daemon).
        .target(
            name: "UserStoreClient",
            dependencies: [
                "Varlink", "CUnixSocket", "UserStoreInterface",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // recvmsg/sendmsg with SCM_RIGHTS, SO_PEERCRED and epoll (C macros and packed structs Swift cannot use).
        .target(name: "CUnixSocket"),
        // Child processes that die with the daemon (vfork, PR_SET_PDEATHSIG, execve: no Swift API
        // runs code between fork and exec), and waiting for any process's end (pidfd).
        .target(name: "CChildProcess"),
        // libsystemd: sd_notify, sd_listen_fds, sd_journal_sendv.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // Structured events to the systemd journal (sd_journal_sendv) or stderr.
        .target(
            name: "UserStoreJournal",
            dependencies: ["CSystemd", .product(name: "Logging", package: "swift-log")]
        ),
        // userstored.yaml: typed, validated, with environment overrides; shared by daemon and CLI.
        .target(
            name: "UserStoreConfiguration",
            dependencies: [
                "UserStoreCore",
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Yams", package: "Yams"),
            ]
        ),
        // The wire shapes of io.userstore.*: named errors and fleet replies (daemon and CLI).
        .target(name: "UserStoreProtocol", dependencies: ["UserStoreCore", "Varlink", "UserStoreInterface"]),
        // A cluster's serving side: the peer links forwarded calls travel on (mutual TLS over
        // swift-nio), the forwarder's choice of owner, the shared release record in etcd.
        .target(
            name: "UserStoreClusterServing",
            dependencies: [
                "UserStoreCluster", "UserStoreConfiguration", "UserStoreCore", "UserStoreInterface", "UserStoreProtocol", "UserStoreReplication", "Varlink",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
            ]
        ),
        // The daemon as a library: configuration, socket server, request handling, lifecycle.
        .target(
            name: "UserStoreServer",
            dependencies: [
                "UserStoreCore", "Varlink", "CSystemd", "UserStoreJournal", "UserStoreConfiguration", "UserStoreProtocol", "CUnixSocket", "UserStoreInterface",
                "UserStoreCluster", "UserStoreClusterServing", "UserStoreS3", "UserStoreReplication",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            resources: [.embedInCode("Interfaces/io.userstore.Store.varlink"), .embedInCode("Interfaces/io.userstore.Admin.varlink")]
        ),
        // Debian's libzstd: the host log's objects are zstd frames.
        .systemLibrary(name: "CZstd", providers: [.apt(["libzstd-dev"])]),
        // The off-host copy (#18, #35): Litestream driven per store, its replica restored,
        // synced and checked; the daemon's request path uses it through ReplicationEngine.
        .target(
            name: "UserStoreReplication",
            dependencies: [
                "UserStoreCore", "UserStoreConfiguration", "UserStoreProtocol", "UserStoreInterface", "CChildProcess", "UserStoreS3", "CZstd",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // libedit's line editor and history for userstorectl's interactive sql mode.
        .systemLibrary(name: "CEditLine", providers: [.apt(["libedit-dev"])]),
        // userstorectl's work: daemon client, output, progress, linter, offline operations.
        .target(
            name: "UserStoreCtl",
            dependencies: [
                "UserStoreCore", "Varlink", "UserStoreClient", "UserStoreConfiguration", "UserStoreProtocol", "CEditLine", "UserStoreInterface",
                "UserStoreCluster", // the key store the daemon opens, a bucket or etcd included (OfflineKeyStore)
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),
        .executableTarget(
            name: "userstorectl",
            dependencies: [
                "UserStoreCtl", "UserStoreCore", "Varlink", "UserStoreConfiguration", "UserStoreReplication", "UserStoreInterface",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "userstored",
            dependencies: [
                "UserStoreServer", "UserStoreConfiguration",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // The S3 client userstored replicates with (the host log's objects, folds, fences, the
        // writer lease, erases): SigV4 over AsyncHTTPClient.
        .target(
            name: "UserStoreS3",
            dependencies: [
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .testTarget(name: "UserStoreS3Tests", dependencies: ["UserStoreS3", "ClusterTestSupport"]),
        // More than one host (#19): bucket placement, and etcd through its v3 JSON gateway.
        .target(
            name: "UserStoreCluster",
            dependencies: [
                "UserStoreCore", "UserStoreConfiguration", "UserStoreReplication", // EtcdKeyStore, and opening any key store
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Real etcd members for the cluster tests (Debian's etcd-server).
        .target(name: "ClusterTestSupport", path: "Tests/ClusterTestSupport"),
        .testTarget(name: "UserStoreClusterTests", dependencies: ["UserStoreCluster", "UserStoreCore", "ClusterTestSupport"]),
        // make bench: every scenario against its baseline in one run (not part of the tests).
        .executableTarget(
            name: "userstore-bench",
            dependencies: [
                "UserStoreCore", "Varlink", "UserStoreClient", "UserStoreConfiguration", "UserStoreS3",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // A child process the crash tests SIGKILL in the middle of a migration.
        .executableTarget(
            name: "userstore-test-helper",
            dependencies: ["UserStoreCore"],
            path: "Tests/Helpers/userstore-test-helper"
        ),
        .testTarget(
            name: "UserStoreCoreTests",
            dependencies: ["UserStoreCore", "userstore-test-helper", "CSQLiteSizeCache", "CSyncFS",
                           .product(name: "Crypto", package: "swift-crypto"),
                           .product(name: "GRDB", package: "GRDB.swift"), .product(name: "GRDBSQLite", package: "GRDB.swift")]
        ),
        // Writes journal entries inside a private mount namespace for the wire-level tests.
        .executableTarget(
            name: "userstore-journal-probe",
            dependencies: ["UserStoreJournal", "Varlink", .product(name: "Logging", package: "swift-log")],
            path: "Tests/Helpers/userstore-journal-probe"
        ),
        .testTarget(name: "VarlinkTests", dependencies: ["Varlink", "VarlinkJSON"]),
        .testTarget(
            name: "UserStoreServerTests",
            dependencies: ["UserStoreInterface", "UserStoreServer", "Varlink", "CChildProcess", "UserStoreCore", "UserStoreJournal",
                           "userstored", "userstorectl", "userstore-journal-probe", "UserStoreClient",
                           "UserStoreCluster", "ClusterTestSupport", "UserStoreFuzzTargets", "DaemonTestSupport", "UserStoreReplication", "UserStoreConfiguration",
                           .product(name: "Prometheus", package: "swift-prometheus"), .product(name: "Logging", package: "swift-log")]
        ),
        // A real userstored on a temporary directory, a raw varlink connection, a NOTIFY_SOCKET:
        // what the daemon's, the client's and userstorectl's tests share.
        .target(name: "DaemonTestSupport", dependencies: ["Varlink", "CUnixSocket"], path: "Tests/DaemonTestSupport"),
        // Litestream's control socket, its sync lanes and bucket counts, against a real Litestream.
        .testTarget(name: "UserStoreReplicationTests", dependencies: ["UserStoreReplication", "UserStoreCore", "UserStoreConfiguration", "DaemonTestSupport", "ClusterTestSupport",
                                                                      .product(name: "Logging", package: "swift-log")]),
        // The Swift client library against the real daemon.
        .testTarget(name: "UserStoreClientTests", dependencies: ["UserStoreClient", "Varlink", "CUnixSocket", "DaemonTestSupport", "userstored"]),
        // userstorectl, the real binary, against the real daemon.
        .testTarget(name: "UserStoreCtlTests", dependencies: ["UserStoreCtl", "Varlink", "DaemonTestSupport", "userstored", "userstorectl"]),
        .testTarget(name: "UserStoreConfigurationTests", dependencies: ["UserStoreConfiguration", "UserStoreCore"]),
        // What the fuzzers check (Fuzz/Targets): outside the shipping modules, reaching their
        // decoding through `package` access; the fuzzer and FuzzCorpusTests feed the same map.
        .target(
            name: "UserStoreFuzzTargets",
            dependencies: ["UserStoreServer", "UserStoreCore", "UserStoreInterface", "Varlink", .product(name: "GRDBSQLite", package: "GRDB.swift")],
            path: "Fuzz/Targets"
        ),
    ],
    swiftLanguageModes: [.v6]
)

// The fuzzer (scripts/fuzz.sh builds it in .build-fuzz with -sanitize=fuzzer): only with
// USERSTORE_FUZZ=1, so that a normal build never needs libFuzzer. One executable for every
// target (USERSTORE_FUZZ_TARGET picks one); their bodies live in UserStoreFuzzTargets
// (VarlinkFuzzing, CoreFuzzing, ServerFuzzing.targets), and the tests replay Fuzz/corpus
// through the same map.
if Context.environment["USERSTORE_FUZZ"] == "1" {
    package.targets.append(.target(name: "CFuzzer", path: "Fuzz/CFuzzer"))
    package.targets.append(.executableTarget(name: "fuzz", dependencies: ["UserStoreFuzzTargets", "CFuzzer"], path: "Fuzz/fuzz",
                                             swiftSettings: [.unsafeFlags(["-parse-as-library"])]))
}
