import UserStoreClient
import UserStoreInterface
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// userstorectl's connection to userstored: a ``UserStoreClient`` with one connection (an
/// interactive transaction belongs to its connection). Every failure becomes a ``CtlError``
/// with the right exit code and a one-line message that names the socket.
///
/// The calls run on the client's own thread (`client.executor`), so they need no thread of
/// Swift's cooperative pool while they wait for the daemon — a command that blocks one (a
/// prompt waiting for a line) cannot starve them, even on a one-core machine. If the client's
/// threads could not start, the work runs on the global executor.
public final class DaemonClient: Sendable {
    /// The socket used when neither `--socket` nor `USERSTORE_SOCKET` says otherwise.
    public static let defaultSocket = "/run/userstore/userstore.sock"

    public let socketPath: String
    private let client: UserStoreClient

    private init(socketPath: String, client: UserStoreClient) {
        self.socketPath = socketPath
        self.client = client
    }

    /// Connects to the daemon at `socketPath` (exit code 3 if it cannot).
    public static func connect(socketPath: String) async throws(CtlError) -> DaemonClient {
        var configuration = UserStoreClient.Configuration(socketPath: socketPath)
        configuration.connections = 1
        let daemon = DaemonClient(socketPath: socketPath, client: UserStoreClient(configuration: configuration))
        do {
            try await daemon.onClientThread { [client = daemon.client] in try await client.connect() }
        } catch let error as UserStoreError where error.kind == .connectionFailed {
            let denied = error.systemError == EACCES || error.systemError == EPERM
            let hint = denied ? " (permission denied: is this user in the socket's group?)" : " (is userstored running?)"
            throw CtlError(.unreachable, "userstorectl: cannot reach userstored at \(socketPath): \(Self.reason(error))\(hint)")
        } catch {
            throw CtlError(.unreachable, "userstorectl: cannot reach userstored at \(socketPath): \(error)")
        }
        return daemon
    }

    /// Connects to the first of `candidates` that answers; the error names every one tried and
    /// why it failed.
    public static func connect(trying candidates: [String], searched: String? = nil) async throws(CtlError) -> DaemonClient {
        var reasons: [String] = searched.map { [$0] } ?? []
        for path in candidates {
            guard access(path, F_OK) == 0 else {
                reasons.append("\(path): no such socket")
                continue
            }
            do {
                return try await connect(socketPath: path)
            } catch {
                reasons.append(error.message.replacingOccurrences(of: "userstorectl: cannot reach userstored at ", with: ""))
            }
        }
        throw CtlError(.unreachable, "userstorectl: cannot reach userstored; looked at:\n  " + reasons.joined(separator: "\n  ")
                       + "\nstart it (systemctl start userstored, or scripts/run.sh in a checkout) or pass --socket PATH")
    }

    deinit {
        let client = self.client
        Task(executorPreference: client.executor) { await client.shutdown() }
    }

    /// Calls the daemon's `method` (the table the daemon dispatches on) and returns its reply.
    public func call(_ method: Method, _ parameters: [String: JSONValue] = [:], descriptors: [Int32] = []) async throws(CtlError) -> [String: JSONValue] {
        try await call(method.rawValue, parameters, descriptors: descriptors)
    }

    /// Calls the daemon's streaming `method`; `body` sees each reply, the last one included.
    public func stream(_ method: Method, _ parameters: [String: JSONValue] = [:], _ body: ([String: JSONValue]) throws -> Void) async throws(CtlError) {
        try await stream(method.rawValue, parameters, body)
    }

    /// Calls a method and returns its reply. `descriptors` travel with it (`SCM_RIGHTS`).
    public func call(_ method: String, _ parameters: [String: JSONValue] = [:], descriptors: [Int32] = []) async throws(CtlError) -> [String: JSONValue] {
        do {
            return try await onClientThread { [client] in try await client.call(method, parameters, passing: descriptors) }
        } catch {
            throw failure(error)
        }
    }

    /// Calls a streaming method; `body` sees each reply, the last one included.
    public func stream(_ method: String, _ parameters: [String: JSONValue] = [:], _ body: ([String: JSONValue]) throws -> Void) async throws(CtlError) {
        do {
            let replies = IteratorBox(try await onClientThread { [client] in try await client.stream(method, parameters) }.makeAsyncIterator())
            while let reply = try await onClientThread({ try await replies.next() }) {
                do {
                    try body(reply)
                } catch let error as CtlError {
                    throw error
                } catch {
                    // The command's own failure (writing the output, say), not the daemon's.
                    throw CtlError(.someFailed, "userstorectl: \(error)")
                }
            }
        } catch let error as CtlError {
            throw error
        } catch {
            throw failure(error)
        }
    }

    /// Lets Ctrl-C end the call in flight: the connection closes (the daemon stops the work it
    /// has not started) and the call fails with exit code 130.
    public func interruptOnSignal() {
        Interrupt.watch { [client] in
            Task(executorPreference: client.executor) { await client.shutdown() }
        }
    }

    private func failure(_ error: any Error) -> CtlError {
        if Interrupt.requested { return CtlError(.interrupted, "interrupted") }
        guard let error = error as? UserStoreError else {
            return CtlError(.unreachable, "userstorectl: lost the connection to userstored at \(socketPath): \(error)")
        }
        if error.kind == .daemon {
            return CtlError.from(name: error.qualifiedName ?? error.name, parameters: error.details, socket: socketPath)
        }
        return CtlError(.unreachable, "userstorectl: lost the connection to userstored at \(socketPath): \(error.message)")
    }

    private static func reason(_ error: UserStoreError) -> String {
        guard let code = error.systemError else { return error.message }
        return String(cString: strerror(code))
    }

    /// Runs `operation` on the client's thread.
    private func onClientThread<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withTaskExecutorPreference(client.executor) { try await operation() }
    }
}

/// A stream's iterator, advanced one `next()` at a time.
private final class IteratorBox: @unchecked Sendable { // one next() at a time: each is awaited before the next (DaemonClient.stream)
    private var iterator: ReplySequence.AsyncIterator

    init(_ iterator: ReplySequence.AsyncIterator) {
        self.iterator = iterator
    }

    func next() async throws -> [String: JSONValue]? {
        try await iterator.next()
    }
}
