/// A varlink method call as a client sends it: `{"method": "io.userstore.Store.Open", "parameters": {...}}`
/// (the daemon reads calls in place, without building one: `UserStoreServer`'s `Request`).
public struct VarlinkCall: Sendable, Equatable {
    /// The fully qualified method name.
    public var method: String
    /// The call's parameters (an empty object when absent).
    public var parameters: [String: JSONValue]
    /// The caller accepts several replies (`"continues": true` on all but the last).
    public var more: Bool
    /// The caller wants no reply at all.
    public var oneway: Bool

    public init(method: String, parameters: [String: JSONValue] = [:], more: Bool = false, oneway: Bool = false) {
        self.method = method
        self.parameters = parameters
        self.more = more
        self.oneway = oneway
    }

    /// The call as JSON, for clients.
    public var message: JSONValue {
        var members: [String: JSONValue] = ["method": .string(method)]
        if !parameters.isEmpty { members["parameters"] = .object(parameters) }
        if more { members["more"] = true }
        if oneway { members["oneway"] = true }
        return .object(members)
    }
}

/// A named varlink error with parameters a program can act on.
public struct VarlinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Fully qualified error name, e.g. `io.userstore.Store.MigrationFailed`.
    public var name: String
    /// The error's parameters.
    public var parameters: [String: JSONValue]

    public init(_ name: String, _ parameters: [String: JSONValue] = [:]) {
        self.name = name
        self.parameters = parameters
    }

    public var description: String {
        parameters.isEmpty ? name : "\(name) \(JSONValue.object(parameters).serialized)"
    }

    // The standard errors of org.varlink.service.
    public static func interfaceNotFound(_ interface: String) -> VarlinkError {
        VarlinkError("org.varlink.service.InterfaceNotFound", ["interface": .string(InputQuote.prefix(interface))])
    }
    public static func methodNotFound(_ method: String) -> VarlinkError {
        VarlinkError("org.varlink.service.MethodNotFound", ["method": .string(InputQuote.prefix(method))])
    }
    public static func methodNotImplemented(_ method: String) -> VarlinkError {
        VarlinkError("org.varlink.service.MethodNotImplemented", ["method": .string(method)])
    }
    public static func invalidParameter(_ parameter: String) -> VarlinkError {
        VarlinkError("org.varlink.service.InvalidParameter", ["parameter": .string(parameter)])
    }
    public static func expectedMore() -> VarlinkError {
        VarlinkError("org.varlink.service.ExpectedMore")
    }
    public static func permissionDenied() -> VarlinkError {
        VarlinkError("org.varlink.service.PermissionDenied")
    }
    /// A reply that is not a varlink reply at all (not a JSON object): raised on the client's
    /// side, never sent. Not part of org.varlink.service, which has no such error. (A message
    /// that is not a call is the service's to name: the daemon's `InvalidRequest`.)
    public static func invalidReply(_ reason: String) -> VarlinkError {
        VarlinkError("org.varlink.InvalidReply", ["reason": .string(reason)])
    }
}

/// Encodes replies, each terminated by the NUL byte that frames varlink messages.
public enum VarlinkReply {
    /// `{"parameters": {...}, "continues": true?}\0` with the parameters written by `body`
    /// (which must write one JSON object).
    public static func encode<E: Error>(continues: Bool = false, into writer: inout JSONWriter,
                                        _ body: (inout JSONWriter) throws(E) -> Void) throws(E) {
        writer.raw("{\"parameters\":")
        try body(&writer)
        if continues { writer.raw(",\"continues\":true") }
        writer.raw("}")
        writer.raw(byte: 0)
    }

    /// A reply whose parameters are `parameters`.
    public static func encode(_ parameters: [String: JSONValue], continues: Bool = false) -> [UInt8] {
        var writer = JSONWriter()
        encode(continues: continues, into: &writer) { $0.write(.object(parameters)) }
        return writer.bytes
    }

    /// An error reply.
    public static func encode(_ error: VarlinkError) -> [UInt8] {
        var writer = JSONWriter()
        encode(error, into: &writer)
        return writer.bytes
    }

    /// Appends an error reply to `writer`.
    public static func encode(_ error: VarlinkError, into writer: inout JSONWriter) {
        writer.raw("{\"error\":")
        writer.write(error.name)
        writer.raw(",\"parameters\":")
        writer.write(.object(error.parameters))
        writer.raw("}")
        writer.raw(byte: 0)
    }
}

/// One reply as a client reads it.
public struct VarlinkReplyMessage: Sendable, Equatable {
    public var parameters: [String: JSONValue]
    public var continues: Bool
    /// The error name, when the reply is an error.
    public var error: String?

    public init(message: JSONValue) throws(VarlinkError) {
        guard case .object(let members) = message else { throw .invalidReply("a reply must be a JSON object") }
        parameters = members["parameters"]?.objectValue ?? [:]
        continues = members["continues"]?.boolValue ?? false
        error = members["error"]?.stringValue
    }

    /// Throws the reply's error, if it is one.
    public func checked() throws(VarlinkError) -> VarlinkReplyMessage {
        if let error { throw VarlinkError(error, parameters) }
        return self
    }
}
