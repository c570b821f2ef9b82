import UserStoreCore
import Varlink

/// Typed access to a call's parameters; a missing or mistyped one is an
/// `org.varlink.service.InvalidParameter` naming it.
struct CallParameters {
    let values: [String: JSONValue]

    init(_ call: VarlinkCall) {
        values = call.parameters
    }

    func string(_ key: String) throws(VarlinkError) -> String {
        guard let value = values[key]?.stringValue else { throw .invalidParameter(key) }
        return value
    }

    func optionalString(_ key: String) throws(VarlinkError) -> String? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let text = value.stringValue else { throw .invalidParameter(key) }
        return text
    }

    func optionalBool(_ key: String) throws(VarlinkError) -> Bool? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let flag = value.boolValue else { throw .invalidParameter(key) }
        return flag
    }

    func int(_ key: String) throws(VarlinkError) -> Int64 {
        guard let value = values[key]?.integerValue else { throw .invalidParameter(key) }
        return value
    }

    func optionalInt(_ key: String) throws(VarlinkError) -> Int64? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let number = value.integerValue else { throw .invalidParameter(key) }
        return number
    }

    func optionalStrings(_ key: String) throws(VarlinkError) -> [String]? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let array = value.arrayValue else { throw .invalidParameter(key) }
        var strings: [String] = []
        for element in array {
            guard let text = element.stringValue else { throw .invalidParameter(key) }
            strings.append(text)
        }
        return strings
    }

    func optionalInts(_ key: String) throws(VarlinkError) -> [Int64]? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let array = value.arrayValue else { throw .invalidParameter(key) }
        var numbers: [Int64] = []
        for element in array {
            guard let number = element.integerValue else { throw .invalidParameter(key) }
            numbers.append(number)
        }
        return numbers
    }

    /// The `user` parameter as a validated ID (`InvalidUser` when it is not one).
    func user(_ key: String = "user") throws(VarlinkError) -> UserID {
        try Self.userID(try string(key))
    }

    static func userID(_ text: String) throws(VarlinkError) -> UserID {
        do {
            return try UserID(text)
        } catch {
            throw VarlinkError("io.userstore.Store.InvalidUser", ["user": .string(text), "reason": .string(error.description)])
        }
    }
}
