import Varlink

/// Every error the client throws (besides `CancellationError` and, from decoding, `DecodingError`).
///
/// An error the daemon replied with has ``kind`` ``Kind/daemon`` and its ``name`` is the
/// varlink error's last component — `"SQLError"`, `"MigrationFailed"`, `"LimitExceeded"`, ...
/// (io.userstore.Store.varlink lists them) — with the daemon's ``parameters``. A failure of the
/// connection itself is one of the other kinds, never a crash:
///
/// ```swift
/// do {
///     try await alice.execute("INSERT INTO notes(id) VALUES (1)")
/// } catch let error as UserStoreError where error.name == "SQLError" && error.code == 2067 {
///     // UNIQUE constraint failed
/// }
/// ```
public struct UserStoreError: Error, Sendable, CustomStringConvertible {
    /// Where the error comes from.
    public enum Kind: Sendable, Equatable {
        /// The daemon replied with this error; the call was processed (and may have failed part-way
        /// only as its method documents: a Batch's transaction, a Commit, ...).
        case daemon
        /// No connection to the daemon could be made (socket missing, refused, permission
        /// denied); the call was not sent.
        case connectionFailed
        /// The connection broke after the call was sent and before its reply: the call may or
        /// may not have run. Calls that could have written are never retried by the client.
        case connectionClosed
        /// The daemon's reply was not a varlink reply the client understands.
        case protocolViolation
        /// The client was shut down (``UserStoreClient/shutdown()``) before or during the call.
        case clientShutDown
        /// The call was refused before it was sent: an argument no daemon could take (more than
        /// 16 descriptors to pass, or one that is not open).
        case invalidArgument
    }

    /// Where the error comes from.
    public let kind: Kind
    /// The error's short name: the daemon's error (`"SQLError"`), or for the other kinds
    /// `"ConnectionFailed"`, `"ConnectionClosed"`, `"ProtocolViolation"`, `"ClientShutDown"`,
    /// `"InvalidArgument"`.
    public let name: String
    /// The daemon's full error name (`io.userstore.Store.SQLError`), for ``Kind/daemon``.
    public let qualifiedName: String?
    /// The error's parameters as the daemon sent them (for ``Kind/daemon``), scalars as
    /// ``SQLValue``s (true/false as 1/0; nested JSON as its text).
    public let parameters: [String: SQLValue]
    /// The error's parameters exactly as the daemon sent them (booleans, nested arrays and
    /// objects included), for ``Kind/daemon``; empty for the other kinds.
    public let details: [String: JSONValue]
    /// What went wrong, in words: the daemon's `message` or `reason` parameter, or the transport's.
    public let message: String
    /// The operating system's error number (`errno`) behind a ``Kind/connectionFailed``:
    /// `ENOENT` (no socket), `ECONNREFUSED` (no daemon behind it), `EACCES` (not in the
    /// socket's group), ...; nil for the other kinds.
    public let systemError: Int32?

    init(kind: Kind, name: String, message: String, systemError: Int32? = nil) {
        self.kind = kind
        self.name = name
        self.qualifiedName = nil
        self.parameters = [:]
        self.details = [:]
        self.message = message
        self.systemError = systemError
    }

    /// The daemon's error reply `qualifiedName` with the parameters object at `object` of
    /// `view` (read as cells are: scalars as ``SQLValue``s, anything else as its JSON text).
    init(daemonError qualifiedName: String, _ view: JSONView, parameters object: Int?) {
        kind = .daemon
        systemError = nil
        self.qualifiedName = qualifiedName
        name = qualifiedName.split(separator: ".").last.map(String.init) ?? qualifiedName
        var scalars: [String: SQLValue] = [:]
        var details: [String: JSONValue] = [:]
        if let object {
            view.forEachMember(of: object) { key, value in
                let name = view.string(key)
                scalars[name] = SQLValue(view, value) ?? .text(view.value(value).serialized)
                details[name] = view.value(value)
            }
        }
        self.parameters = scalars
        self.details = details
        if case .text(let text)? = scalars["message"] {
            message = text
        } else if case .text(let text)? = scalars["reason"] {
            message = text
        } else {
            message = scalars.isEmpty ? name : view.value(object!).serialized
        }
    }

    /// SQLite's extended result code, for `SQLError`, `MigrationFailed` and `StorageFailure`.
    public var code: Int64? {
        if case .integer(let code)? = parameters["code"] ?? parameters["sqliteCode"] { return code }
        return nil
    }

    /// The failing statement's position in a Batch, for `SQLError`.
    public var statementIndex: Int? {
        if case .integer(let index)? = parameters["index"] { return Int(index) }
        return nil
    }

    public var description: String {
        kind == .daemon ? "\(qualifiedName ?? name): \(message)" : "\(name): \(message)"
    }

    static func shutDown() -> UserStoreError {
        UserStoreError(kind: .clientShutDown, name: "ClientShutDown", message: "the client was shut down")
    }

    static func closed(_ detail: String) -> UserStoreError {
        UserStoreError(kind: .connectionClosed, name: "ConnectionClosed", message: detail)
    }

    static func connectFailed(_ detail: String, systemError: Int32? = nil) -> UserStoreError {
        UserStoreError(kind: .connectionFailed, name: "ConnectionFailed", message: detail, systemError: systemError)
    }

    static func invalidArgument(_ detail: String) -> UserStoreError {
        UserStoreError(kind: .invalidArgument, name: "InvalidArgument", message: detail)
    }

    static func protocolViolation(_ detail: String) -> UserStoreError {
        UserStoreError(kind: .protocolViolation, name: "ProtocolViolation", message: detail)
    }
}
