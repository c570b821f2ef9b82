import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
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
        try optionalArray(key) { $0.stringValue }
    }

    func optionalInts(_ key: String) throws(VarlinkError) -> [Int64]? {
        try optionalArray(key) { $0.integerValue }
    }

    func optionalNumber(_ key: String) throws(VarlinkError) -> Double? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let number = Self.number(value) else { throw .invalidParameter(key) }
        return number
    }

    func optionalNumbers(_ key: String) throws(VarlinkError) -> [Double]? {
        try optionalArray(key, Self.number)
    }

    /// An integer or a real as a Double.
    private static func number(_ value: JSONValue) -> Double? {
        if case .real(let number) = value { return number }
        return value.integerValue.map(Double.init)
    }

    /// An optional array whose every element `element` reads (nil: the element is mistyped).
    private func optionalArray<T>(_ key: String, _ element: (JSONValue) -> T?) throws(VarlinkError) -> [T]? {
        guard let value = values[key], !value.isNull else { return nil }
        guard let array = value.arrayValue else { throw .invalidParameter(key) }
        var elements: [T] = []
        for item in array {
            guard let read = element(item) else { throw .invalidParameter(key) }
            elements.append(read)
        }
        return elements
    }

    /// The `user` parameter as a validated ID (`InvalidUser` when it is not one).
    func user(_ key: String = "user") throws(VarlinkError) -> UserID {
        try Self.userID(try string(key))
    }

    static func userID(_ text: String) throws(VarlinkError) -> UserID {
        do {
            return try UserID(text)
        } catch {
            throw VarlinkError(.invalidUser, ["user": .string(InputQuote.prefix(text)), "reason": .string(error.description)])
        }
    }
}
