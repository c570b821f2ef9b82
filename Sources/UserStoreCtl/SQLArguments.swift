import Varlink

/// The values of a statement's `?` parameters given on the command line (`userstorectl sql`,
/// `query`): a JSON scalar keeps its type (`42`, `2.5`, `null`, `true`, `"quoted"`), anything
/// else is text. An integer outside the signed 64-bit range is refused, as the daemon refuses
/// it: read as a real it would not be the number typed.
public enum SQLArguments {
    public static func values(_ arguments: [String]) throws -> [JSONValue] {
        try arguments.enumerated().map { offset, argument in
            guard let value = try? JSONParser().parse(argument), value.arrayValue == nil, value.objectValue == nil else {
                return .string(argument)
            }
            if case .real = value, argument.allSatisfy({ $0.isNumber || $0 == "-" }) {
                throw CtlError(.usage, "argument \(offset + 1) (\(InputQuote.prefix(argument))) is an integer outside the signed 64-bit range "
                               + "(\(Int64.min) ... \(Int64.max)); quote it as JSON ('\"\(InputQuote.prefix(argument))\"') to bind it as text")
            }
            return value
        }
    }
}
