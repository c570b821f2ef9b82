import Synchronization

/// The reply to one call, handed from the loop that reads it to the task that waits for it.
///
/// Whichever comes first wins: the reply, or (for a cancellable wait) the task's cancellation.
/// A reply that comes after the waiter gave up is dropped; it still took its place in the
/// connection's order, so the replies behind it reach their own calls.
final class PendingReply: Sendable {
    private enum State {
        case pending
        case waiting(UnsafeContinuation<[UInt8], any Error>)
        case done(Result<[UInt8], any Error>)
        case over
    }

    private let state = Mutex(State.pending)

    /// Delivers the reply's bytes (or the connection's failure); from any thread, once.
    func complete(_ result: Result<[UInt8], any Error>) {
        settle(.done(result))?.resume(with: result)
    }

    /// Waits for the reply. `cancellable`: a cancelled task stops waiting with
    /// `CancellationError` (the call may still run); otherwise the reply is awaited whatever
    /// happens (Commit and Rollback must learn their outcome).
    func value(cancellable: Bool) async throws -> [UInt8] {
        guard cancellable else {
            return try await withUnsafeThrowingContinuation { wait($0) }
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { wait($0) }
        } onCancel: {
            settle(.over)?.resume(throwing: CancellationError())
        }
    }

    /// The first outcome (a reply, or the waiter giving up) wins: a pending reply takes
    /// `outcome`; a waiting one ends, and its continuation is returned to be resumed (outside
    /// the lock); a settled one stays as it is.
    private func settle(_ outcome: State) -> UnsafeContinuation<[UInt8], any Error>? {
        state.withLock { state in
            switch state {
            case .pending:
                state = outcome
                return nil
            case .waiting(let continuation):
                state = .over
                return continuation
            case .done, .over:
                return nil
            }
        }
    }

    private func wait(_ continuation: UnsafeContinuation<[UInt8], any Error>) {
        let ready = state.withLock { state -> Result<[UInt8], any Error>? in
            switch state {
            case .pending:
                state = .waiting(continuation)
                return nil
            case .done(let result):
                state = .over
                return result
            case .over: // cancelled before it waited
                return .failure(CancellationError())
            case .waiting:
                preconditionFailure("a reply waited for twice")
            }
        }
        if let ready { continuation.resume(with: ready) }
    }
}
