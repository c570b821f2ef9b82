import Foundation
import UserStoreInterface
import Varlink

/// One reply of a watch (``UserStore/watch(tables:since:values:)``).
public struct WatchEvent: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// The watch is in place at ``WatchEvent/position``: every commit after it will come.
        /// Sent once per call to the daemon, so again after each reconnection.
        case ready
        /// One committed transaction's changed rows (``WatchEvent/changes``).
        case changes
        /// The store changed under the app (a migration, an import, a restore): re-read it.
        case reset
    }

    public let kind: Kind
    /// The store's position after this transaction (for ``Kind/ready``: the current one).
    public let position: Int64
    /// When the transaction committed (RFC 3339), for ``Kind/changes``.
    public let committedAt: String?
    public let changes: [RowChange]
}

/// One row a transaction changed.
public struct RowChange: Sendable, Equatable {
    public enum Operation: String, Sendable {
        case insert, update, delete
    }

    public let table: String
    public let operation: Operation
    public let rowid: Int64
    /// The new row (watches with `values: true`; nil for a delete), values decoded exactly.
    public let values: [String: SQLValue]?
}

/// A user's committed changes as they happen (``UserStore/watch(tables:since:values:)``).
///
/// It survives the connection: when the connection breaks or the daemon restarts, it connects
/// again and resumes from the last position it delivered, so nothing is missed and nothing
/// comes twice (a ``WatchEvent/Kind/ready`` marks each new start). It ends with an error only
/// for what resuming cannot mend: `PositionLost` (the changes after the position are no longer
/// kept: re-read, then watch again without `since`), a refused call, or the client shutting
/// down. A watcher the daemon dropped for reading too slowly (`WatchTooSlow`) resumes by itself.
/// Leaving the loop or cancelling the task ends the watch.
public struct ChangeSequence: AsyncSequence, Sendable {
    public typealias Element = WatchEvent
    let stream: AsyncThrowingStream<WatchEvent, any Error>

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<WatchEvent, any Error>.AsyncIterator
        public mutating func next() async throws -> WatchEvent? { try await base.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: stream.makeAsyncIterator()) }
}

extension UserStore {
    /// The daemon's errors after which a watch resumes from its last position (the others end it).
    static let resumable: Set<String> = Set([ErrorName.watchTooSlow, .shuttingDown, .retry, .hostUnreachable].map(\.short))

    /// The user's committed changes, from now (or after `since`, a position an earlier watch
    /// delivered), in commit order — each transaction once.
    ///
    /// ```swift
    /// for try await event in alice.watch(tables: ["notes"]) {
    ///     if event.kind == .reset { reload() } else { apply(event.changes) }
    /// }
    /// ```
    /// - Parameters:
    ///   - tables: only transactions touching these tables (and only their rows); nil: all.
    ///   - since: resume after this position.
    ///   - values: each inserted or updated row's new values too.
    public func watch(tables: [String]? = nil, since: Int64? = nil, values: Bool = false) -> ChangeSequence {
        let client = self.client, user = self.user
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: WatchEvent.self)
        let task = Task {
            var position = since
            var pause: Duration = .milliseconds(50)
            while !Task.isCancelled {
                var message = CallMessage(method: Method.watch.rawValue)
                message.field("user", user)
                message.field("values", values)
                if let tables { message.field("tables", tables) }
                // A position the store no longer has (older than it keeps, or past it: the store
                // went back to an older copy) is the daemon's PositionLost, which ends the watch.
                if let position { message.field("since", position) }
                do {
                    for try await event in try await client.stream(message.finish(more: true), as: WatchStreamDecoder.self) {
                        if event.kind != .ready || position == nil { position = event.position }
                        continuation.yield(event)
                        pause = .milliseconds(50)
                    }
                } catch let error as UserStoreError where error.kind == .connectionClosed || error.kind == .connectionFailed
                                                         || (error.kind == .daemon && Self.resumable.contains(error.name)) {
                    // Resume from the last position delivered, after a pause that grows to 2 s.
                    try? await Task.sleep(for: pause)
                    pause = min(pause * 2, .seconds(2))
                    continue
                } catch {
                    continuation.finish(throwing: error)
                    return
                }
            }
            continuation.finish(throwing: CancellationError())
        }
        continuation.onTermination = { _ in task.cancel() }
        return ChangeSequence(stream: stream)
    }
}

/// A Watch's replies, decoded in place (values exactly).
struct WatchStreamDecoder: StreamDecoder {
    mutating func decode(_ view: JSONView, _ parameters: Int?) throws -> [WatchEvent] {
        guard let parameters, let at = view.member("position", of: parameters), let position = view.integer(at) else {
            throw UserStoreError.protocolViolation("a Watch reply without a position")
        }
        if let ready = view.member("ready", of: parameters), view.bool(ready) == true {
            return [WatchEvent(kind: .ready, position: position, committedAt: nil, changes: [])]
        }
        if let reset = view.member("reset", of: parameters), view.bool(reset) == true {
            return [WatchEvent(kind: .reset, position: position, committedAt: nil, changes: [])]
        }
        var changes: [RowChange] = []
        if let list = view.member("changes", of: parameters) {
            try view.forEachElement(of: list) { _, change in
                guard let table = view.member("table", of: change).map(view.string),
                      let operation = view.member("operation", of: change).map(view.string).flatMap(RowChange.Operation.init(rawValue:)),
                      let rowid = view.member("rowid", of: change).flatMap(view.integer) else {
                    throw UserStoreError.protocolViolation("a Watch change without table, operation or rowid")
                }
                var values: [String: SQLValue]?
                if let object = view.member("values", of: change) {
                    var row: [String: SQLValue] = [:]
                    view.forEachMember(of: object) { name, value in row[view.string(name)] = SQLValue(view, value) }
                    values = row
                }
                changes.append(RowChange(table: table, operation: operation, rowid: rowid, values: values))
            }
        }
        let committedAt = view.member("committedAt", of: parameters).map(view.string)
        return [WatchEvent(kind: .changes, position: position, committedAt: committedAt, changes: changes)]
    }
}
