// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "userstore",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "UserStoreCore", targets: ["UserStoreCore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
    ],
    targets: [
        // The store engine: user IDs, paths, migrations, bookkeeping, the registry of open stores.
        .target(
            name: "UserStoreCore",
            dependencies: [
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
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
            dependencies: ["UserStoreCore", "userstore-test-helper"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
