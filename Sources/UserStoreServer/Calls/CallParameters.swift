import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// Typed access to a call's parameters, read in place from the message the session parsed once
/// (no tree of values is built); a missing or mistyped one is an
/// `org.varlink.service.InvalidParameter` naming it.
package struct CallParameters: Sendable {
    let message: JSONMessage
    /// The `parameters` object's token; nil when the call has none (or `null`).
    let object: Int?

    /// The parameters of the call in `message`, whose `parameters` object is the token `object`
    /// (``JSONView/callParameters()``).
    init(_ message: JSONMessage, object: Int?) {
        self.message = message
        self.object = object
    }

    func string(_ key: String) throws(VarlinkError) -> String {
        guard let value = try optionalString(key) else { throw .invalidParameter(key) }
        return value
    }

    func optionalString(_ key: String) throws(VarlinkError) -> String? {
        try read(key) { view, index in view.kind(index) == .string ? view.string(index) : nil }
    }

    func optionalBool(_ key: String) throws(VarlinkError) -> Bool? {
        try read(key) { view, index in view.bool(index) }
    }

    func int(_ key: String) throws(VarlinkError) -> Int64 {
        guard let value = try optionalInt(key) else { throw .invalidParameter(key) }
        return value
    }

    func optionalInt(_ key: String) throws(VarlinkError) -> Int64? {
        try read(key) { view, index in view.integer(index) }
    }

    func optionalStrings(_ key: String) throws(VarlinkError) -> [String]? {
        try optionalArray(key) { view, index in view.kind(index) == .string ? view.string(index) : nil }
    }

    func optionalInts(_ key: String) throws(VarlinkError) -> [Int64]? {
        try optionalArray(key) { view, index in view.integer(index) }
    }

    func optionalNumber(_ key: String) throws(VarlinkError) -> Double? {
        try read(key) { view, index in view.double(index) }
    }

    func optionalNumbers(_ key: String) throws(VarlinkError) -> [Double]? {
        try optionalArray(key) { view, index in view.double(index) }
    }

    /// The member `key` read by `value`: nil when it is absent or `null`; `InvalidParameter`
    /// when `value` cannot read it (mistyped).
    private func read<T>(_ key: String, _ value: (JSONView, Int) -> T?) throws(VarlinkError) -> T? {
        guard let object else { return nil }
        let found = message.withView { view -> Lookup<T> in
            var name = key
            guard let index = name.withUTF8({ view.member($0, of: object) }), view.kind(index) != .null else { return .absent }
            return value(view, index).map(Lookup.value) ?? .mistyped
        }
        switch found {
        case .absent: return nil
        case .mistyped: throw .invalidParameter(key)
        case .value(let read): return read
        }
    }

    /// An optional array whose every element `element` reads (nil: the element is mistyped).
    private func optionalArray<T>(_ key: String, _ element: (JSONView, Int) -> T?) throws(VarlinkError) -> [T]? {
        try read(key) { view, index -> [T]? in
            guard view.kind(index) == .array else { return nil }
            var elements: [T] = []
            var mistyped = false
            view.forEachElement(of: index) { _, item in
                guard !mistyped else { return }
                if let read = element(view, item) { elements.append(read) } else { mistyped = true }
            }
            return mistyped ? nil : elements
        }
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

/// What a parameter's lookup found.
private enum Lookup<T> {
    case absent, mistyped, value(T)
}
