import UserStoreInterface
import Varlink

extension VarlinkError {
    /// The error `name` of the daemon's interfaces (``ErrorName``) with `parameters`.
    public init(_ name: ErrorName, _ parameters: [String: JSONValue] = [:]) {
        self.init(name.rawValue, parameters)
    }

    /// Whether this is the daemon's error `name`.
    public func `is`(_ name: ErrorName) -> Bool { self.name == name.rawValue }
}
