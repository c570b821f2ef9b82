import UserStoreInterface
import Varlink

extension VarlinkError {
    /// The error `name` of the daemon's interfaces (``ErrorName``) with `parameters`.
    public init(_ name: ErrorName, _ parameters: [String: JSONValue] = [:]) {
        self.init(name.rawValue, parameters)
    }
}
