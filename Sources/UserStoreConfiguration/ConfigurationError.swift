/// A configuration the daemon refuses to start with; names the key and the problem.
public struct ConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The file the configuration came from.
    public var file: String
    /// The offending key (dot-separated), or nil for a problem with the file itself.
    public var key: String?
    /// What is wrong and what is expected.
    public var problem: String

    public init(file: String, key: String?, problem: String) {
        self.file = file
        self.key = key
        self.problem = problem
    }

    public var description: String {
        if let key { return "\(file): key '\(key)': \(problem)" }
        return "\(file): \(problem)"
    }
}
