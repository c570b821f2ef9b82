import NIOCore
import Synchronization
import Varlink

/// The rows of a streamed query (``UserStore/stream(_:_:)``), as they arrive.
///
/// The daemon sends the result in chunks while the client reads them; when this sequence's
/// buffer holds more than its high watermark of rows the client stops reading the socket, the
/// daemon's socket buffer fills, and the daemon stops stepping the statement until the consumer
/// catches up: memory stays bounded on both sides whatever the result's size.
///
/// A stream holds one pooled connection, and the user's store (as a read transaction: it sees
/// one snapshot, and that user's other calls wait) until it ends. Iterate it to the end, or
/// stop early: leaving the loop or cancelling the task ends the stream (the connection is
/// closed, which ends it on the daemon's side too). Iterate it once.
public struct RowSequence: AsyncSequence, Sendable {
    public typealias Element = Row
    let producer: StreamSink<RowStreamDecoder>.Producer

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: StreamSink<RowStreamDecoder>.Producer.AsyncIterator

        public mutating func next() async throws -> Row? {
            try await base.next()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: producer.makeAsyncIterator())
    }
}

/// The replies of a call made with `more` (``UserStoreClient/stream(_:_:)``): each reply's
/// parameters, as they arrive, the last one (without `continues`) included.
///
/// Backpressure, the connection it holds and ending it early work as for ``RowSequence``.
public struct ReplySequence: AsyncSequence, Sendable {
    public typealias Element = [String: JSONValue]
    let producer: StreamSink<ReplyStreamDecoder>.Producer

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: StreamSink<ReplyStreamDecoder>.Producer.AsyncIterator

        public mutating func next() async throws -> [String: JSONValue]? {
            try await base.next()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: producer.makeAsyncIterator())
    }
}

/// Turns one streamed reply (its view and the index of its `parameters` object) into elements.
protocol StreamDecoder: Sendable {
    associatedtype Element: Sendable
    init()
    mutating func decode(_ view: JSONView, _ parameters: Int?) throws -> [Element]
}

/// A streamed Query's rows; every reply names the columns, the first one's serve for all.
struct RowStreamDecoder: StreamDecoder {
    private var columns: Columns?

    mutating func decode(_ view: JSONView, _ parameters: Int?) throws -> [Row] {
        let columns = self.columns ?? Replies.columns(view, parameters)
        self.columns = columns
        return try Replies.rows(view, parameters, columns: columns)
    }
}

/// Any method's streamed replies, one element (its parameters) per reply.
struct ReplyStreamDecoder: StreamDecoder {
    mutating func decode(_ view: JSONView, _ parameters: Int?) throws -> [[String: JSONValue]] {
        [parameters.map { view.value($0).objectValue ?? [:] } ?? [:]]
    }
}

/// What a connection needs of a stream: its replies in, its end out. (Not generic, so a
/// connection's queue can hold any stream.)
protocol StreamResponder: AnyObject, Sendable {
    /// Takes one reply; false when the consumer has enough buffered for now (stop reading).
    func receive(_ view: JSONView, _ parameters: Int?, last: Bool) -> Bool
    /// Ends the stream with `error`.
    @discardableResult
    func fail(_ error: any Error) -> Bool
}

/// Feeds a stream's replies into its sequence on the client's loop, and turns the consumer's
/// demand into reading the socket or not.
final class StreamSink<Decoder: StreamDecoder>: StreamResponder, NIOAsyncSequenceProducerDelegate {
    typealias Producer = NIOThrowingAsyncSequenceProducer<Decoder.Element, any Error,
                                                          NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark, StreamSink>

    private struct State {
        var source: Producer.Source?
        var decoder = Decoder()
        var completed = false
        var terminated = false
    }

    private let state = Mutex(State())
    private let connection: ClientConnection
    /// Runs once when the stream is over, however it ended (gives the connection back).
    private let onEnd: @Sendable (_ completed: Bool) -> Void

    init(connection: ClientConnection, onEnd: @escaping @Sendable (_ completed: Bool) -> Void) {
        self.connection = connection
        self.onEnd = onEnd
    }

    /// Makes the sequence this sink feeds.
    func makeProducer(lowWatermark: Int, highWatermark: Int) -> Producer {
        let made = Producer.makeSequence(backPressureStrategy: .init(lowWatermark: lowWatermark, highWatermark: highWatermark),
                                         finishOnDeinit: false, delegate: self)
        state.withLock { $0.source = made.source }
        return made.sequence
    }

    func receive(_ view: JSONView, _ parameters: Int?, last: Bool) -> Bool {
        // Decoded outside the lock (the consumer's `fail` or end need not wait for a chunk); the
        // loop's thread is the only one that decodes, so the decoder's state stays consistent.
        guard let taken = state.withLock({ state in state.source.map { ($0, state.decoder) } }) else { return true }
        let source = taken.0
        var decoder = taken.1
        let elements: [Decoder.Element]
        do {
            elements = try decoder.decode(view, parameters)
        } catch {
            return fail(error) // not completed: the connection is closed
        }
        state.withLock { state in
            state.decoder = decoder
            if last { state.completed = true }
        }
        let result = source.yield(contentsOf: elements)
        if last { source.finish() }
        return result == .produceMore || last
    }

    @discardableResult
    func fail(_ error: any Error) -> Bool {
        let source = state.withLock { state -> Producer.Source? in
            // The daemon's error reply ends the stream on both sides: the connection is fine.
            if (error as? UserStoreError)?.kind == .daemon { state.completed = true }
            defer { state.source = nil }
            return state.source
        }
        source?.finish(error)
        return true
    }

    /// Forgets this sink without ending its sequence's consumer (it has none yet): the stream was
    /// never sent, and whoever abandons it gives the connection back itself.
    func abandon() {
        state.withLock { state in
            state.terminated = true
            state.source = nil
        }
    }

    func produceMore() {
        connection.resumeReading()
    }

    func didTerminate() {
        let completed = state.withLock { state -> Bool? in
            guard !state.terminated else { return nil }
            state.terminated = true
            state.source = nil
            return state.completed
        }
        guard let completed else { return }
        // Completed, the connection reads on (the last reply and an error reply never pause it)
        // and goes back to the pool. Stopped early, the pool closes it: that ends the stream on
        // the daemon's side too (it rolls back the read and frees the store) without reading
        // the rest.
        onEnd(completed)
    }
}

extension UserStoreClient {
    /// Sends `message` (a call with `more`) on a connection of its own and returns the sink
    /// and producer of its replies.
    func stream<Decoder: StreamDecoder>(_ message: [UInt8], as _: Decoder.Type) async throws -> StreamSink<Decoder>.Producer {
        let pool = self.pool
        var attempt = 0
        while true {
            attempt += 1
            let lease = try await pool.acquire(exclusive: true)
            let sink = StreamSink<Decoder>(connection: lease.connection) { completed in pool.release(lease, discard: !completed) }
            let bufferRows = max(4, configuration.streamBufferRows)
            let producer = sink.makeProducer(lowWatermark: bufferRows / 4, highWatermark: bufferRows)
            do {
                try lease.connection.send(message, to: .stream(sink))
                return producer
            } catch {
                // Never sent (the connection had closed, say after an idle timeout): as for
                // ``call(_:readOnly:passing:)``, safe to send on another connection.
                guard attempt < 4 else {
                    sink.fail(UserStoreClient.public(error))
                    return producer
                }
                sink.abandon()
                pool.release(lease, discard: true)
            }
        }
    }
}
