import UserStoreClient
import UserStoreInterface
import Varlink

/// Exit codes scripts can trust (documented in `userstorectl --help` and docs/cli.md).
public enum CtlExitCode: Int32, Sendable {
    /// Everything asked for succeeded.
    case success = 0
    /// The command ran, but some stores failed (migration, verification) or the lint found problems.
    case someFailed = 1
    /// Bad usage (ArgumentParser's own code for validation errors).
    case usage = 2
    /// The daemon is unreachable, refused us, or (offline) holds the data directory.
    case unreachable = 3
    /// Interrupted with Ctrl-C; work in flight finished or rolled back; run again to finish.
    case interrupted = 130
}

/// A failure printed as one line on stderr, with its exit code. Never a stack trace.
public struct CtlError: Error, Sendable, CustomStringConvertible {
    public var exitCode: CtlExitCode
    public var message: String

    public init(_ exitCode: CtlExitCode, _ message: String) {
        self.exitCode = exitCode
        self.message = message
    }

    public var description: String { message }

    /// The daemon's error reply `name` (qualified or short) with its `parameters`, in words:
    /// the short name, then every parameter (`message` and `reason` first, the rest by name),
    /// each as `key: value`. An empty text is left out rather than printed as `key: `.
    static func from(name: String, parameters: [String: JSONValue], socket: String) -> CtlError {
        let short = name.split(separator: ".").last.map(String.init) ?? name
        if short == ErrorName.wrongHost.short, let host = parameters["host"] {
            // An admin call acts on this host's stores only; the owner's daemon serves it.
            let address = parameters["address"].map(text) ?? ""
            return CtlError(.someFailed, "WrongHost: user \(parameters["user"].map(text) ?? "?") is on host \(text(host))"
                            + (address.isEmpty ? "" : " (\(address))") + ", epoch \(parameters["epoch"].map(text) ?? "?"): run userstorectl there")
        }
        let detail = describe(parameters)
        // PermissionDenied with statement: true refuses one statement (ATTACH, the bookkeeping);
        // only a refused caller (the access rules) means exit code 3.
        let accessDenied = short == ErrorName.permissionDenied.short && parameters["statement"] != .bool(true)
        let code: CtlExitCode = accessDenied ? .unreachable : .someFailed
        let prefix = accessDenied ? "\(socket): permission denied" : short
        return CtlError(code, detail.isEmpty ? prefix : "\(prefix): \(detail)")
    }

    /// Every parameter as `key: value`, joined by `; `: `message` and `reason` first, then the
    /// others by name; empty texts left out.
    static func describe(_ parameters: [String: JSONValue]) -> String {
        let first = ["message", "reason"]
        let keys = first.filter { parameters[$0] != nil } + parameters.keys.filter { !first.contains($0) }.sorted()
        return keys.compactMap { key -> String? in
            let value = text(parameters[key]!)
            return value.isEmpty ? nil : "\(key): \(value)"
        }.joined(separator: "; ")
    }

    /// A parameter as printed: text as the daemon wrote it (unquoted), anything else as JSON
    /// (exact integers, `true`, arrays and objects whole).
    private static func text(_ value: JSONValue) -> String {
        if case .string(let text) = value { return text }
        return value.serialized
    }
}
