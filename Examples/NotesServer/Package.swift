// swift-tools-version:6.1
import PackageDescription

// The repository this example lives in, by path. SwiftPM names a path dependency after its
// directory, which is whatever the clone is called: read it rather than assume "userstore".
let repository = Context.packageDirectory + "/../.."
let repositoryIdentity = String(Context.packageDirectory.split(separator: "/").dropLast(2).last ?? "userstore").lowercased()

let package = Package(
    name: "NotesServer",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: repository),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .executableTarget(
            name: "NotesServer",
            dependencies: [
                .product(name: "UserStoreClient", package: repositoryIdentity),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
