import Synchronization
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// A call as the handlers off the event loop's fast path see it: its decoded form, and the
/// message it came in, from which SQL and parameters are read in place.
struct Request: Sendable {
    /// Method, parameters (decoded), `more`, `oneway`.
    let call: VarlinkCall
    /// The call's bytes and tokens.
    let message: JSONMessage
    /// File descriptors the caller passed with the call (`SCM_RIGHTS`).
    var descriptors = PassedDescriptors([])

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
final class PassedDescriptors: Sendable {
    private let descriptors: Mutex<[Int32?]>

    init(_ descriptors: [Int32]) {
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
