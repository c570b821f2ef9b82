import Logging
import UserStoreCore
import UserStoreInterface
import Varlink

/// Dispatches a call that the event loop's ``FastPath`` did not answer to its interface after
/// the access check, and turns every failure into a named varlink error reply. One client's bad
/// request never affects another's.
struct RequestRouter {
    let context: DaemonContext
    let logger: Logger

    /// Handles `call`; throws only when the reply cannot be sent (the peer went away).
    func handle(_ request: Request, peer: PeerIdentity, send: @escaping ReplySink) async throws {
        let call = request.call
        let discard: ReplySink = { _ in }
        let sink: ReplySink = call.oneway ? discard : send
        let started = ContinuousClock.now
        var outcome: String?
        defer {
            let elapsed = ContinuousClock.now - started
            context.metrics?.requestHandles(method: Method(rawValue: call.method)).record(outcome: outcome, nanoseconds: UInt64(max(0, elapsed.wholeMicroseconds)) * 1000,
                                                                        user: call.parameters["user"]?.stringValue)
        }
        do {
            try await dispatch(request, peer: peer, send: sink)
        } catch let failure as ReplyFailed {
            outcome = "disconnected"
            throw failure.underlying
        } catch {
            let failure = Errors.from(error)
            outcome = failure.name.split(separator: ".").last.map(String.init) ?? failure.name
            try await sink(VarlinkReply.encode(failure))
        }
        // A streamed call (Watch, a streamed Query) stays open as long as its client reads: its
        // time is not a request's time.
        if !call.more {
            context.logIfSlow(method: call.method, user: call.parameters["user"]?.stringValue ?? "", elapsed: ContinuousClock.now - started)
        }
    }

    /// Wraps the sink so a transport failure is told apart from a method's own errors.
    private struct ReplyFailed: Error { let underlying: any Error }

    private func dispatch(_ request: Request, peer: PeerIdentity, send: @escaping ReplySink) async throws {
        let call = request.call
        let guarded: ReplySink = { bytes in
            do { try await send(bytes) } catch { throw ReplyFailed(underlying: error) }
        }
        let interface = Method.Interface(rawValue: String(call.interface))
        if context.isShuttingDown && interface != .service {
            throw Errors.shuttingDown
        }
        switch interface {
        case .service?:
            break
        case .store?:
            guard peer.grant.store else { throw Errors.permissionDenied("uid \(peer.uid) is not an allowed client (access.clientUsers / access.clientGroups)") }
        case .admin?:
            guard peer.grant.admin else {
                throw Errors.permissionDenied("uid \(peer.uid) is not an administrator (access.adminUsers / access.adminGroups)")
            }
        case nil:
            throw VarlinkError.interfaceNotFound(String(call.interface))
        }
        guard let method = Method(rawValue: call.method) else { throw VarlinkError.methodNotFound(call.method) }
        switch method.interface {
        case .service: try await ServiceMethods().handle(method, call, send: guarded)
        case .store: try await StoreMethods(context: context).handle(method, request, peer: peer, send: guarded)
        case .admin: try await AdminMethods(context: context).handle(method, request, peer: peer, send: guarded)
        }
    }
}
