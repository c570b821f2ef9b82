import Foundation
import HTTPTypes
import Hummingbird
import UserStoreClient

/// A note as the API shows it (and as a row of the notes table decodes).
struct Note: Codable, ResponseEncodable {
    let id: Int64
    let title: String
    let body: String
    let pinned: Bool
    let created_at: String
}

/// What a client sends to create or change a note.
struct NoteInput: Decodable {
    let title: String
    let body: String?
    let pinned: Bool?
}

/// The routes: `GET /notes`, `POST /notes`, `GET /notes/:id`, `PATCH /notes/:id`,
/// `DELETE /notes/:id`, `GET /notes/count` (through a transaction, as an example of one), and
/// `GET /notes/events`: the user's note changes as Server-Sent Events (``NoteEvents``).
struct NotesAPI {
    let client: UserStoreClient

    func router() -> Router<BasicRequestContext> {
        let router = Router()
        router.add(middleware: UserStoreErrorMiddleware())
        router.get("/notes") { request, _ -> [Note] in
            try await store(request).query(Note.self, "SELECT id, title, body, pinned, created_at FROM notes ORDER BY pinned DESC, id")
        }
        router.post("/notes") { request, context -> EditedResponse<Note> in
            let input = try await request.decode(as: NoteInput.self, context: context)
            let store = try store(request)
            let notes = try await store.query(Note.self, """
                INSERT INTO notes (title, body, pinned) VALUES (?, ?, ?)
                RETURNING id, title, body, pinned, created_at
                """, input.title, input.body ?? "", input.pinned ?? false)
            return EditedResponse(status: .created, response: notes[0])
        }
        router.get("/notes/count") { request, _ -> [String: Int64] in
            let counts = try await store(request).transaction(mode: .deferred) { tx in
                let notes = try await tx.query("SELECT count(*) FROM notes")[0].decode(Int64.self, column: 0)
                let pinned = try await tx.query("SELECT count(*) FROM notes WHERE pinned")[0].decode(Int64.self, column: 0)
                return ["notes": notes, "pinned": pinned]
            }
            return counts
        }
        router.get("/notes/events") { request, _ -> Response in
            try NoteEvents(store: try store(request), lastEventID: request.headers[NoteEvents.lastEventID]).response()
        }
        router.get("/notes/:id") { request, context -> Note in
            let notes = try await store(request).query(Note.self, "SELECT id, title, body, pinned, created_at FROM notes WHERE id = ?",
                                                        try context.parameters.require("id", as: Int64.self))
            guard let note = notes.first else { throw HTTPError(.notFound, message: "no such note") }
            return note
        }
        router.patch("/notes/:id") { request, context -> Note in
            let input = try await request.decode(as: NoteInput.self, context: context)
            let notes = try await store(request).query(Note.self, """
                UPDATE notes SET title = ?, body = coalesce(?, body), pinned = coalesce(?, pinned) WHERE id = ?
                RETURNING id, title, body, pinned, created_at
                """, input.title, input.body, input.pinned, try context.parameters.require("id", as: Int64.self))
            guard let note = notes.first else { throw HTTPError(.notFound, message: "no such note") }
            return note
        }
        router.delete("/notes/:id") { request, context -> HTTPResponse.Status in
            let result = try await store(request).execute("DELETE FROM notes WHERE id = ?", try context.parameters.require("id", as: Int64.self))
            return result.changes == 1 ? .noContent : .notFound
        }
        return router
    }

    static let userHeader = HTTPField.Name("X-User")!

    /// The requesting user's store.
    private func store(_ request: Request) throws -> UserStore {
        guard let user = request.headers[Self.userHeader], !user.isEmpty else {
            throw HTTPError(.badRequest, message: "say who you are in the X-User header")
        }
        return client.store(for: user)
    }
}

/// The daemon's errors as HTTP: a bad user ID or a refused statement is the client's fault
/// (400), a constraint it broke a conflict (409), an unreachable daemon 503, the rest 500.
struct UserStoreErrorMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as UserStoreError {
            switch (error.kind, error.name) {
            case (.daemon, "InvalidUser"), (.daemon, "PermissionDenied"):
                throw HTTPError(.badRequest, message: error.message)
            case (.daemon, "SQLError") where error.code.map { $0 & 0xFF == 19 } == true: // SQLITE_CONSTRAINT
                throw HTTPError(.conflict, message: error.message)
            case (.connectionFailed, _), (.connectionClosed, _), (.daemon, "ShuttingDown"):
                throw HTTPError(.serviceUnavailable, message: error.message)
            default:
                context.logger.error("userstore call failed", metadata: ["error": "\(error)"])
                throw HTTPError(.internalServerError)
            }
        }
    }
}
