import DaemonTestSupport
import Foundation
import Testing
import Logging
import UserStoreConfiguration
import UserStoreCore
@testable import UserStoreServer
import Varlink

/// The daemon's request path inside the test process: the real configuration, registry and
/// ``SocketServer`` (event loops, connections, sessions, stores) on a temporary socket, without
/// a child process — so that a protocol test runs in-process and against the live daemon alike
/// (``ServedDaemon``), and a transport test can look at the loops it runs on.
final class InProcessDaemon: ServedDaemon, @unchecked Sendable {
    let files: DaemonHarness
    let context: DaemonContext
    let server: SocketServer
    var socketPath: String { files.socketPath }
    /// Whether ``connect()`` makes a `socketpair` and hands the daemon its other end, instead
    /// of connecting to the socket: the transport with no listener and no path in between.
    var overSocketPairs = false

    private init(files: DaemonHarness, context: DaemonContext, server: SocketServer) {
        self.files = files
        self.context = context
        self.server = server
    }

    /// A new client connection: to the socket, or over a new socket pair whose other end the
    /// daemon serves as it would an accepted connection (its credentials are this process's).
    func connect() throws -> VarlinkConnection {
        guard overSocketPairs else { return try connectToSocket() }
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw VarlinkConnection.TransportError.io(path: "socketpair", message: String(cString: strerror(errno)))
        }
        server.adopt(pair[0], peer: nil)
        let connection = VarlinkConnection(descriptor: pair[1], name: "socketpair")
        connection.setReceiveTimeout(seconds: 60)
        return connection
    }

    /// Serves a new temporary data directory (`extraConfig`: YAML appended to the configuration).
    static func start(migrations: [String: String]? = nil, extraConfig: String = "") async throws -> InProcessDaemon {
        let files = try DaemonHarness(migrations: migrations, extraConfig: extraConfig)
        let configuration = try await ConfigurationLoader.load(path: files.configPath)
        let migrations = try ConfigurationLoader.loadMigrations(configuration)
        let lock = try DataDirectoryLock(layout: StoreLayout(dataDirectory: configuration.dataDirectory))
        let logger = Logger(label: "in-process-userstored", factory: { _ in SwiftLogNoOpLogHandler() })
        let index = FleetIndex()
        let release = try ReleaseTracker(dataDirectory: configuration.dataDirectory, migrations: migrations, policy: configuration.rollout,
                                         index: index, logger: logger)
        let registry = StoreRegistry(configuration: configuration.registryConfiguration, migrations: migrations, lock: lock,
                                     observer: ObserverFanOut(observers: [index, release]), gate: release)
        release.attach(registry)
        let context = DaemonContext(configuration: configuration, registry: registry, index: index, release: release, logger: logger)
        let server = try await SocketServer.bind(path: configuration.socketPath, inherited: nil, context: context, logger: logger,
                                                 onReady: {}, onStopping: {})
        return InProcessDaemon(files: files, context: context, server: server)
    }

    /// Graceful shutdown: every connection finishes what it started; the stores are closed.
    func stop() async {
        await server.drain()
        await context.registry.shutdown()
    }
}

/// A daemon a protocol test talks to over its socket: a live `userstored` process
/// (``DaemonHarness``) or the same request path in-process (``InProcessDaemon``).
protocol ServedDaemon: AnyObject {
    var socketPath: String { get }
    /// A new client connection (with a receive timeout, so a test never hangs).
    func connect() throws -> VarlinkConnection
}

extension ServedDaemon {
    func connect() throws -> VarlinkConnection { try connectToSocket() }

    /// A new connection to the daemon's socket (with a receive timeout).
    func connectToSocket() throws -> VarlinkConnection {
        let connection = try VarlinkConnection(path: socketPath)
        connection.setReceiveTimeout(seconds: 60)
        return connection
    }
}

extension DaemonHarness: ServedDaemon {}

/// Where a protocol test runs its daemon.
enum Serving: String, CaseIterable, CustomTestStringConvertible {
    /// A `userstored` process, over its socket.
    case liveDaemon
    /// The request path in this process, over its socket.
    case inProcess
    /// The request path in this process, each connection a `socketpair` the daemon adopts.
    case socketPair

    var testDescription: String { rawValue }

    /// A daemon on a new temporary data directory, serving; `stop` ends it.
    func start(extraConfig: String = "") async throws -> any ServedDaemon {
        switch self {
        case .liveDaemon:
            let daemon = try DaemonHarness(extraConfig: extraConfig)
            try daemon.start()
            return daemon
        case .inProcess, .socketPair:
            let daemon = try await InProcessDaemon.start(extraConfig: extraConfig)
            daemon.overSocketPairs = self == .socketPair
            return daemon
        }
    }

    /// Starts a daemon, runs `body` (blocking client code) with it on a thread of its own
    /// (``onThread(_:)``), and stops the daemon, whether `body` threw or not.
    func run(extraConfig: String = "", _ body: @escaping @Sendable (any ServedDaemon) throws -> Void) async throws {
        let daemon = try await start(extraConfig: extraConfig)
        nonisolated(unsafe) let served = daemon
        do {
            try await onThread { try body(served) }
        } catch {
            await Self.stop(daemon)
            throw error
        }
        await Self.stop(daemon)
    }

    /// Ends a daemon ``start(extraConfig:)`` returned.
    static func stop(_ daemon: any ServedDaemon) async {
        if let daemon = daemon as? InProcessDaemon { await daemon.stop() }
        if let daemon = daemon as? DaemonHarness { _ = daemon.stop() }
    }
}

/// Runs `body` (blocking client code: sockets, semaphores) on a thread of its own, off the
/// cooperative pool that an in-process daemon's tasks need.
func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}
