import Varlink

/// A call as the handlers off the event loop's fast path see it: its decoded form, and the
/// message it came in, from which SQL and parameters are read in place.
struct Request: Sendable {
    /// Method, parameters (decoded), `more`, `oneway`.
    let call: VarlinkCall
    /// The call's bytes and tokens.
    let message: JSONMessage

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
    static func single(_ view: JSONView, _ call: Int?) throws(VarlinkError) -> Self {
        guard let call, let sql = view.member("sql", of: call), view.kind(sql) == .string else { throw .invalidParameter("sql") }
        return Self(sql: sql, parameters: view.member("parameters", of: call), index: nil)
    }

    /// The statements of a Batch call (`list`: its `statements` array), each an object with
    /// `sql` and optional `parameters`.
    static func batch(_ view: JSONView, _ list: Int?, maximum: Int) throws(VarlinkError) -> [Self] {
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
