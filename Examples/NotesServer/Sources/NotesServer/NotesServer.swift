import Foundation
import Hummingbird
import Logging
import UserStoreClient

/// A per-user notes REST API on userstored: every user's notes live in that user's own
/// SQLite store. The user is the `X-User` header (a real app would take it from its
/// authentication). Uses the schema of the repository's config/migrations.
///
/// Environment: `USERSTORE_SOCKET` (default `.run/userstore.sock`, the dev daemon's),
/// `NOTES_HOST` (default 127.0.0.1), `NOTES_PORT` (default 8080; 0 picks a free port, printed).
@main
struct NotesServer {
    static func main() async throws {
        let environment = ProcessInfo.processInfo.environment
        let socket = environment["USERSTORE_SOCKET"] ?? ".run/userstore.sock"
        let host = environment["NOTES_HOST"] ?? "127.0.0.1"
        let port = Int(environment["NOTES_PORT"] ?? "8080") ?? 8080
        var logger = Logger(label: "NotesServer")
        logger.logLevel = .info
        let client = UserStoreClient(socketPath: socket)
        let app = Application(
            router: NotesAPI(client: client).router(),
            configuration: .init(address: .hostname(host, port: port), serverName: "NotesServer"),
            services: [client],
            onServerRunning: { channel in
                // The bound address, for scripts and tests that asked for port 0.
                FileHandle.standardOutput.write(Data("listening on \(channel.localAddress?.description ?? "?")\n".utf8))
            },
            logger: logger
        )
        try await app.runService()
    }
}
