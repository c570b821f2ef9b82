import Synchronization
import UserStoreInterface
import UserStoreProtocol
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// A call as the handlers off the event loop's fast path see it: the message it came in, parsed
/// once by the session, and what the session read of it. Parameters, SQL and values are read in
/// place from the message.
package struct Request: Sendable {
    /// The method, matched once by the session; nil when the daemon has no method of that name
    /// (``name`` says which, for the error).
    let method: Method?
    /// The fully qualified method name as the caller wrote it.
    let name: String
    /// The caller accepts several replies.
    let more: Bool
    /// The caller wants no reply.
    let oneway: Bool
    /// The call's bytes and tokens.
    let message: JSONMessage
    /// Its parameters, read in place.
    let parameters: CallParameters
    /// File descriptors the caller passed with the call (`SCM_RIGHTS`).
    var descriptors = PassedDescriptors([])

    /// The call in `message` (already parsed), whose method the session matched as `method`;
    /// throws what a message that is not a call gets (`InvalidRequest`, or `InvalidParameter`
    /// for `parameters` that are not an object).
    package init(_ message: JSONMessage, method: Method?, descriptors: PassedDescriptors) throws(VarlinkError) {
        let read = try message.withView { view throws(VarlinkError) -> (name: String, parameters: Int?, more: Bool, oneway: Bool) in
            guard view.kind(0) == .object else { throw .invalidRequest("a message must be a JSON object") }
            guard let token = view.member("method", of: 0), view.kind(token) == .string, case let name = view.string(token), !name.isEmpty else {
                throw .invalidRequest("the message has no \"method\" string")
            }
            return (name, try view.callParameters(), view.member("more", of: 0).flatMap(view.bool) ?? false,
                    view.member("oneway", of: 0).flatMap(view.bool) ?? false)
        }
        self.method = method
        self.name = read.name
        self.more = read.more
        self.oneway = read.oneway
        self.message = message
        self.parameters = CallParameters(message, object: read.parameters)
        self.descriptors = descriptors
    }

    /// `io.userstore.Store` for `io.userstore.Store.Open`.
    var interfaceName: Substring {
        guard let dot = name.lastIndex(of: ".") else { return "" }
        return name[..<dot]
    }

    /// The statement of a Query or Execute call: `sql` (a string) and `parameters`.
    func statement() throws(VarlinkError) -> SQLRunner.Statement {
        try message.withView { view throws(VarlinkError) in try SQLRunner.Statement.single(view, view.member("parameters", of: 0)) }
    }

    /// The statements of a Batch call.
    func batchStatements(maximum: Int) throws(VarlinkError) -> [SQLRunner.Statement] {
        try message.withView { view throws(VarlinkError) in
            try SQLRunner.Statement.batch(view, view.member("parameters", of: 0).flatMap { view.member("statements", of: $0) }, maximum: maximum)
        }
    }
}

extension JSONView {
    /// The `parameters` object of the call this view reads (a parsed message that is an
    /// object); nil when there is none or it is `null`. Anything else is `InvalidParameter`
    /// (`parameters`): no call runs with it.
    func callParameters() throws(VarlinkError) -> Int? {
        guard let parameters = member("parameters", of: 0) else { return nil }
        switch kind(parameters) {
        case .object: return parameters
        case .null: return nil
        default: throw .invalidParameter("parameters")
        }
    }
}

extension SQLRunner.Statement {
    /// The statement of a Query or Execute call whose parameters object is `call`: `sql` (a
    /// string) and `parameters`.
    package static func single(_ view: JSONView, _ call: Int?) throws(VarlinkError) -> Self {
        guard let call, let sql = view.member("sql", of: call), view.kind(sql) == .string else { throw .invalidParameter("sql") }
        return Self(sql: sql, parameters: view.member("parameters", of: call), index: nil)
    }

    /// The statements of a Batch call (`list`: its `statements` array), each an object with
    /// `sql` and optional `parameters`.
    package static func batch(_ view: JSONView, _ list: Int?, maximum: Int) throws(VarlinkError) -> [Self] {
        guard let list, view.kind(list) == .array else { throw .invalidParameter("statements") }
        guard view.count(list) <= maximum else { throw Errors.limitExceeded("batchStatements", maximum: maximum) }
        var statements: [Self] = []
        statements.reserveCapacity(view.count(list))
        var failure: VarlinkError?
        view.forEachElement(of: list) { offset, element in
            guard failure == nil else { return }
            guard let sql = view.member("sql", of: element), view.kind(sql) == .string else {
                failure = .invalidParameter("statements[\(offset)].sql")
                return
            }
            statements.append(Self(sql: sql, parameters: view.member("parameters", of: element), index: offset))
        }
        if let failure { throw failure }
        return statements
    }
}

/// File descriptors a caller passed with a call (`SCM_RIGHTS`), owned by the call: a handler
/// takes the ones it keeps, and the rest are closed when the call ends.
package final class PassedDescriptors: Sendable {
    private let descriptors: Mutex<[Int32?]>

    package init(_ descriptors: [Int32]) {
        self.descriptors = Mutex(descriptors.map { $0 })
    }

    /// How many came with the call.
    var count: Int { descriptors.withLock { $0.count } }

    /// Takes descriptor `index` (the caller closes it); nil when there is none or it was taken.
    func take(_ index: Int) -> Int32? {
        descriptors.withLock { list in
            guard list.indices.contains(index) else { return nil }
            defer { list[index] = nil }
            return list[index]
        }
    }

    /// Closes every descriptor not taken.
    func closeAll() {
        let left = descriptors.withLock { list in
            defer { list = list.map { _ in nil } }
            return list.compactMap { $0 }
        }
        for descriptor in left { close(descriptor) }
    }
}
