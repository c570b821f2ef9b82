import Foundation

/// A temporary directory removed when the value is deinitialised.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init() throws {
        var bytes = Array((NSTemporaryDirectory() + "userstored-test-XXXXXX").utf8CString)
        guard mkdtemp(&bytes) != nil else { throw CocoaError(.fileWriteUnknown) }
        path = String(decoding: bytes.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// Directory of the built products (the test bundle sits beside the executables).
public var productsDirectory: String {
    URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        .deletingLastPathComponent().path
}

/// The repository's root.
public var repositoryRoot: String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
}

/// The python with the `varlink` package (made by scripts/install-deps.sh), for independent checks.
public var testPython: String {
    ProcessInfo.processInfo.environment["USERSTORE_TEST_PYTHON"] ?? repositoryRoot + "/.build/testenv/bin/python3"
}

/// The built `userstorectl` binary.
public var userstorectlPath: String { productsDirectory + "/userstorectl" }

/// The Litestream the tests run (installed by scripts/install-deps.sh).
public var litestreamPath: String { repositoryRoot + "/.build/testenv/bin/litestream" }

/// Runs `sql` on the SQLite file at `path` with the sqlite3 shell; its output, trimmed.
public func sqlite3(_ path: String, _ sql: String) throws -> String {
    try run(["/usr/bin/sqlite3", path, sql]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
}
