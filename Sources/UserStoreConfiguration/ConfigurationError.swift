/// A configuration the daemon refuses to start with; names the key and the problem.
public struct ConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The file the configuration came from.
    public var file: String
    /// The offending key (dot-separated), or nil for a problem with the file itself.
    public var key: String?
    /// What is wrong and what is expected.
    public var problem: String
    /// The environment variable the offending value came from (`USERSTORED_LIMITS_MAX_CONNECTIONS`),
    /// when one overrides the key: then the file is not to blame.
    public var environmentVariable: String?

    public init(file: String, key: String?, problem: String, environmentVariable: String? = nil) {
        self.file = file
        self.key = key
        self.problem = problem
        self.environmentVariable = environmentVariable
    }

    public var description: String {
        if let key, let environmentVariable {
            return "environment variable \(environmentVariable) (overriding key '\(key)' of \(file)): \(problem)"
        }
        if let key { return "\(file): key '\(key)': \(problem)" }
        return "\(file): \(problem)"
    }
}
