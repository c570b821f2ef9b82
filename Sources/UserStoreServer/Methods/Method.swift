import UserStoreInterface
import Varlink

/// What the daemon adds to the shared method table (``Method``, in UserStoreInterface): the
/// method of a call read in place, so that a call's name is matched once, in one place.
extension Method {
    /// The method named by the string at `token` of `view`, read in place: the request path's
    /// own methods (``Interface/store``) without making a `String`, any other by name.
    private static func named(_ view: JSONView, _ token: Int) -> Method? {
        guard view.kind(token) == .string else { return nil }
        // Compared with the raw values' own bytes: literals, so no copy and no reference counting.
        for method in storeMethods where method.rawValue.utf8.withContiguousStorageIfAvailable({ view.stringEquals(token, $0) }) == true {
            return method
        }
        return Method(rawValue: view.string(token))
    }

    /// The method of the call in `view` (its `method` member), if the daemon has it.
    package static func of(_ view: JSONView) -> Method? {
        guard view.kind(0) == .object, let token = view.member("method", of: 0) else { return nil }
        return named(view, token)
    }

    /// The ``Interface/store`` methods, most frequent first.
    static let storeMethods: [Method] = [.query, .execute, .open, .batch, .begin, .commit, .rollback, .watch]
}
