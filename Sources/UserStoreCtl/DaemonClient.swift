import Foundation
import Varlink

/// A connection to userstored for the CLI: every failure becomes a ``CtlError`` with the
/// right exit code and a one-line message that names the socket.
public final class DaemonClient {
    /// The socket used when neither `--socket` nor `USERSTORE_SOCKET` says otherwise.
    public static let defaultSocket = "/run/userstore/userstore.sock"

    public let socketPath: String
    private let connection: VarlinkConnection

    public init(socketPath: String) throws(CtlError) {
        self.socketPath = socketPath
        do {
            connection = try VarlinkConnection(path: socketPath)
        } catch {
            let hint = error.isPermissionDenied ? " (permission denied: is this user in the socket's group?)" : " (is userstored running?)"
            throw CtlError(.unreachable, "userstorectl: cannot reach userstored at \(socketPath): \(Self.reason(error))\(hint)")
        }
    }

    /// Calls a method and returns its reply.
    public func call(_ method: String, _ parameters: [String: JSONValue] = [:], descriptors: [Int32] = []) throws(CtlError) -> [String: JSONValue] {
        do {
            return try connection.call(method, parameters, descriptors: descriptors)
        } catch let error as VarlinkError {
            throw CtlError.from(error, socket: socketPath)
        } catch {
            throw CtlError(.unreachable, "userstorectl: lost the connection to userstored at \(socketPath): \(error)")
        }
    }

    /// Calls a streaming method; `body` sees each reply, the last one included.
    public func stream(_ method: String, _ parameters: [String: JSONValue] = [:], _ body: ([String: JSONValue]) throws -> Void) throws(CtlError) {
        do {
            try connection.stream(method, parameters, body)
        } catch let error as VarlinkError {
            throw CtlError.from(error, socket: socketPath)
        } catch let error as CtlError {
            throw error
        } catch {
            if Interrupt.requested { throw CtlError(.interrupted, "interrupted") }
            throw CtlError(.unreachable, "userstorectl: lost the connection to userstored at \(socketPath): \(error)")
        }
    }

    /// Lets Ctrl-C end a blocking read on this connection.
    public func interruptOnSignal() {
        Interrupt.watch(connection.descriptor)
    }

    private static func reason(_ error: VarlinkConnection.TransportError) -> String {
        switch error {
        case .cannotConnect(_, let message, _): return message
        default: return error.description
        }
    }
}
