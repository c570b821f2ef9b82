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
    typealias Producer = NIOThrowingAsyncSequenceProducer<Row, any Error, NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark, RowStreamSink>

    let producer: Producer

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: Producer.AsyncIterator

        public mutating func next() async throws -> Row? {
            try await base.next()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: producer.makeAsyncIterator())
    }
}

/// Feeds a stream's replies into its ``RowSequence`` on the client's loop, and turns the
/// consumer's demand into reading the socket or not.
final class RowStreamSink: NIOAsyncSequenceProducerDelegate, Sendable {
    private struct State {
        var source: RowSequence.Producer.Source?
        var columns: Columns?
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
    func makeSequence(lowWatermark: Int, highWatermark: Int) -> RowSequence {
        let made = RowSequence.Producer.makeSequence(
            backPressureStrategy: .init(lowWatermark: lowWatermark, highWatermark: highWatermark),
            finishOnDeinit: false, delegate: self)
        state.withLock { $0.source = made.source }
        return RowSequence(producer: made.sequence)
    }

    /// Takes one reply's rows (its `parameters` object in `view`); false when the consumer has
    /// enough buffered for now (stop reading).
    func receive(_ view: JSONView, _ parameters: Int?, last: Bool) -> Bool {
        let (source, columns): (RowSequence.Producer.Source?, Columns?) = state.withLock { state in
            // Every reply names the columns; the first one's serve for all.
            if state.columns == nil { state.columns = Replies.columns(view, parameters) }
            return (state.source, state.columns)
        }
        guard let source, let columns else { return true }
        let rows: [Row]
        do {
            rows = try Replies.rows(view, parameters, columns: columns)
        } catch {
            return fail(error) // not completed: the connection is closed
        }
        if last { state.withLock { $0.completed = true } }
        let result = source.yield(contentsOf: rows)
        if last { source.finish() }
        return result == .produceMore || last
    }

    /// Ends the stream with `error`.
    @discardableResult
    func fail(_ error: any Error) -> Bool {
        let source = state.withLock { state -> RowSequence.Producer.Source? in
            // The daemon's error reply ends the stream on both sides: the connection is fine.
            if (error as? UserStoreError)?.kind == .daemon { state.completed = true }
            defer { state.source = nil }
            return state.source
        }
        source?.finish(error)
        return true
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
