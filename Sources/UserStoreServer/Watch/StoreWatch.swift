import Synchronization
import UserStoreCore
import UserStoreInterface
import UserStoreProtocol
import Varlink

/// `io.userstore.Store.Watch`: a user's committed changes, streamed (docs/watch.md).
///
/// The watch is put in place on the store's queue, between two pieces of work: the store's
/// position P is read and the watcher subscribed to the store's ``ChangeFeed`` in one step, so
/// every commit after P reaches it and none before. It answers `{"ready": true, "position": P}`,
/// then (with `since`) the recorded transactions after `since` up to P, read from the log a page
/// at a time, then each new one as it commits. The store stays open (leased) while watched.
///
/// A watcher never slows the writers: the feed hands each event to ``WatchBuffer`` and returns;
/// past `maxBufferedBytes` of replies not yet taken by the client, the watch ends with
/// `WatchTooSlow` (the last position delivered, to resume from).
struct StoreWatch {
    let context: DaemonContext
    let user: UserID
    /// Lower-case table names; nil: every table.
    let tables: Set<String>?
    let since: Int64?
    let values: Bool
    let maxBufferedBytes: Int

    /// Transactions read from the log per page while catching up.
    static let pageSize = 256
    /// How often an idle watch checks that its client is still there and the daemon still runs.
    static let tick: Duration = .seconds(1)

    func run(send: ReplySink) async throws {
        try await context.registry.withStore(user) { store in
            guard let recorder = store.recorder else {
                throw VarlinkError.invalidRequest("the change stream is off (watch.enabled: false)")
            }
            let buffer = WatchBuffer(tables: tables, values: values, maxBytes: maxBufferedBytes)
            let user = self.user, since = self.since
            let start: Result<Int64, VarlinkError> = try await store.write { db in
                do throws(ChangeLogError) {
                    try recorder.startRecording(db.sqliteConnection!)
                } catch {
                    return .failure(Errors.changeLog(error))
                }
                let (position, trimmed) = recorder.state(db.sqliteConnection!)
                if let since, since < trimmed || since > position {
                    return .failure(Self.positionLost(user, oldest: trimmed + 1))
                }
                buffer.subscribe(to: recorder.feed)
                return .success(position)
            }
            let position = try start.get()
            context.metrics?.watchStarted()
            defer {
                buffer.unsubscribe()
                context.metrics?.watchEnded()
            }
            try await send(Self.reply { writer in
                writer.raw("{\"ready\":true,\"position\":")
                writer.write(position)
                writer.raw(byte: UInt8(ascii: "}"))
            })
            if let since, since < position { try await catchUp(store, recorder, from: since, to: position, send: send) }
            try await follow(buffer, delivered: position, send: send)
        }
    }

    /// Sends the logged transactions after `since` up to `position`.
    private func catchUp(_ store: Store, _ recorder: ChangeRecorder, from since: Int64, to position: Int64, send: ReplySink) async throws {
        var cursor = since
        while cursor < position {
            let after = cursor
            let page = try await store.read { db in recorder.events(db.sqliteConnection!, after: after, limit: Self.pageSize) }
            guard let last = page.last else { break }
            for event in page where event.position <= position && event.concerns(tables) {
                try await send(Self.reply { writer in event.encode(into: &writer, tables: tables, values: values) })
            }
            cursor = min(last.position, position)
        }
    }

    /// Sends each new transaction as it commits, until the client goes, the daemon stops or the
    /// watcher falls too far behind.
    private func follow(_ buffer: WatchBuffer, delivered: Int64, send: ReplySink) async throws {
        var delivered = delivered
        let ticker = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: Self.tick)
                buffer.tick()
            }
        }
        defer { ticker.cancel() }
        for await item in buffer.items {
            switch item {
            case .event(let position, let bytes):
                try await send(bytes)
                buffer.taken(bytes.count)
                delivered = position
                context.metrics?.watchEventSent()
            case .tick:
                if context.isShuttingDown { throw Errors.shuttingDown }
                try await send([]) // throws once the client has gone
            case .ended:
                throw Errors.retry(user: user.rawValue, reason: "the store is being closed (deleted, replaced or moved): watch again with since")
            case .tooSlow:
                context.logWatchDropped(user: user.rawValue, position: delivered, maxBufferedBytes: maxBufferedBytes)
                context.metrics?.watchDropped()
                throw VarlinkError(.watchTooSlow, ["user": .string(user.rawValue), "position": .integer(delivered)])
            }
        }
    }

    static func positionLost(_ user: UserID, oldest: Int64) -> VarlinkError {
        VarlinkError(.positionLost, ["user": .string(user.rawValue), "oldest": .integer(oldest)])
    }

    /// `{"parameters": …, "continues": true}` and its NUL.
    static func reply(_ parameters: (inout JSONWriter) -> Void) -> [UInt8] {
        var writer = JSONWriter(capacity: 256)
        VarlinkReply.encode(continues: true, into: &writer, parameters)
        return writer.bytes
    }
}

/// What a watch has yet to send, filled by the store's feed (on the store's queue, never
/// waiting) and emptied by the watch's task.
final class WatchBuffer: Sendable {
    enum Item: Sendable {
        case event(position: Int64, bytes: [UInt8])
        case tick
        case tooSlow
        /// The store is being closed (deleted, replaced, moved): the watch lets go of it.
        case ended
    }

    let items: AsyncStream<Item>
    private let continuation: AsyncStream<Item>.Continuation
    private let tables: Set<String>?
    private let values: Bool
    private let maxBytes: Int
    private let state = Mutex(State())

    private struct State {
        var buffered = 0
        var dropped = false
        var feed: ChangeFeed?
        var key: UInt64?
    }

    init(tables: Set<String>?, values: Bool, maxBytes: Int) {
        (items, continuation) = AsyncStream.makeStream(of: Item.self)
        self.tables = tables
        self.values = values
        self.maxBytes = maxBytes
    }

    /// Subscribes to `feed` (on the store's queue, where every later commit is published).
    func subscribe(to feed: ChangeFeed) {
        let key = feed.subscribe(ChangeFeed.Subscriber(event: { [self] event in offer(event) }, end: { [self] in
            continuation.yield(.ended)
        }))
        state.withLock {
            $0.feed = feed
            $0.key = key
        }
    }

    func unsubscribe() {
        let (feed, key) = state.withLock { ($0.feed, $0.key) }
        if let feed, let key { feed.unsubscribe(key) }
        continuation.finish()
    }

    private func offer(_ event: ChangeEvent) {
        guard event.concerns(tables) else { return }
        let bytes = StoreWatch.reply { writer in event.encode(into: &writer, tables: tables, values: values) }
        let accepted = state.withLock { state -> Bool? in
            guard !state.dropped else { return nil }
            if state.buffered + bytes.count > maxBytes {
                state.dropped = true
                return false
            }
            state.buffered += bytes.count
            return true
        }
        switch accepted {
        case true?: continuation.yield(.event(position: event.position, bytes: bytes))
        case false?:
            continuation.yield(.tooSlow)
        case nil: break
        }
    }

    func taken(_ count: Int) {
        state.withLock { $0.buffered -= count }
    }

    func tick() {
        continuation.yield(.tick)
    }
}
