import Foundation
import HTTPTypes
import Hummingbird
import ServiceLifecycle
import UserStoreClient

/// `GET /notes/events`: the user's note changes as Server-Sent Events, from the daemon's change
/// stream (`UserStore.watch`). Each committed transaction that touched the notes is one event:
///
///     id: 42
///     event: changes
///     data: [{"operation":"insert","id":7,"note":{"id":7,"title":"…",…}}]
///
/// or `event: reset` (the store changed under the app: reload the list). The event's id is the
/// store's position, so a browser's `EventSource`, reconnecting with `Last-Event-ID`, resumes
/// exactly after the last event it saw. The first event, `ready`, carries the position the
/// stream starts from.
struct NoteEvents {
    static let lastEventID = HTTPField.Name("Last-Event-ID")!

    let store: UserStore
    let lastEventID: String?

    func response() throws -> Response {
        let since = try lastEventID.map { text -> Int64 in
            guard let position = Int64(text), position >= 0 else { throw HTTPError(.badRequest, message: "Last-Event-ID must be a position") }
            return position
        }
        let changes = store.watch(tables: ["notes"], since: since, values: true)
        var headers = HTTPFields()
        headers[.contentType] = "text/event-stream"
        headers[.cacheControl] = "no-cache"
        return Response(status: .ok, headers: headers, body: ResponseBody { writer in
            // An event stream never ends by itself: the app's graceful shutdown (SIGTERM) ends it,
            // or the server would wait for it forever.
            for try await event in changes.cancelOnGracefulShutdown() {
                try await writer.write(ByteBuffer(string: Self.format(event)))
            }
            try await writer.finish(nil)
        })
    }

    /// One event in the text/event-stream format.
    static func format(_ event: WatchEvent) -> String {
        switch event.kind {
        case .ready: return "id: \(event.position)\nevent: ready\ndata: {\"position\":\(event.position)}\n\n"
        case .reset: return "id: \(event.position)\nevent: reset\ndata: {}\n\n"
        case .changes:
            let items = event.changes.map { change -> [String: Any] in
                var item: [String: Any] = ["operation": change.operation.rawValue, "id": change.rowid]
                if let values = change.values { item["note"] = values.mapValues(json) }
                return item
            }
            let data = (try? JSONSerialization.data(withJSONObject: items, options: [.sortedKeys])) ?? Data("[]".utf8)
            return "id: \(event.position)\nevent: changes\ndata: \(String(decoding: data, as: UTF8.self))\n\n"
        }
    }

    private static func json(_ value: SQLValue) -> Any {
        switch value {
        case .null: return NSNull()
        case .integer(let number): return number
        case .real(let number): return number
        case .text(let text): return text
        case .blob(let data): return data.base64EncodedString()
        }
    }
}
