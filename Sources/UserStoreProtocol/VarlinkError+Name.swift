import UserStoreInterface
import Varlink

extension VarlinkError {
    /// The error `name` of the daemon's interfaces (``ErrorName``) with `parameters`.
    public init(_ name: ErrorName, _ parameters: [String: JSONValue] = [:]) {
        self.init(name.rawValue, parameters)
    }

    /// The message is not a call at all (bad JSON, no method), or a call's request cannot be
    /// met as asked: `InvalidRequest` with the reason; the connection stays usable.
    public static func invalidRequest(_ reason: String) -> VarlinkError {
        VarlinkError(.invalidRequest, ["reason": .string(reason)])
    }
}
