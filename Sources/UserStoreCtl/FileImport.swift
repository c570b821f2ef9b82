import Foundation
import UserStoreInterface
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// Imports SQLite files through the daemon, each passed as an open descriptor (the daemon
/// needs no access to the operator's files).
public struct FileImport {
    public let client: DaemonClient
    public var schemaVersion: Int64?
    public var replace = false

    public init(client: DaemonClient, schemaVersion: Int64?, replace: Bool) {
        self.client = client
        self.schemaVersion = schemaVersion
        self.replace = replace
    }

    /// Imports `file` as `user`'s store; returns the daemon's reply.
    public func run(user: String, file: String) async throws(CtlError) -> [String: JSONValue] {
        let descriptor = open(file, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw CtlError(.someFailed, "userstorectl: cannot open \(file): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var parameters: [String: JSONValue] = ["user": .string(user), "replace": .bool(replace)]
        if let schemaVersion { parameters["schemaVersion"] = .integer(schemaVersion) }
        return try await client.call(.importStore, parameters, descriptors: [descriptor])
    }

    /// The files of `directory` that `pattern` (a file name with one `{user}`) matches, with
    /// their user IDs, sorted by name.
    public static func matches(in directory: String, pattern: String) throws(CtlError) -> [(user: String, file: String)] {
        let parts = pattern.components(separatedBy: "{user}")
        guard parts.count == 2 else { throw CtlError(.usage, "userstorectl: --pattern must contain {user} once, as in '{user}.db'") }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory)
        } catch {
            throw CtlError(.someFailed, "userstorectl: cannot list \(directory): \((error as NSError).localizedDescription)")
        }
        return names.sorted().compactMap { name in
            guard name.count > parts[0].count + parts[1].count, name.hasPrefix(parts[0]), name.hasSuffix(parts[1]) else { return nil }
            let user = String(name.dropFirst(parts[0].count).dropLast(parts[1].count))
            return (user, directory + "/" + name)
        }
    }
}
