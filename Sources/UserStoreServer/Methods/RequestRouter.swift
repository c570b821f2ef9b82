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
        let discard: ReplySink = { _ in }
        let sink: ReplySink = request.oneway ? discard : send
        let started = ContinuousClock.now
        var outcome: String?
        let user = (try? request.parameters.optionalString("user")) ?? nil
        defer {
            let elapsed = ContinuousClock.now - started
            context.metrics?.requestHandles(method: request.method).record(outcome: outcome, nanoseconds: UInt64(max(0, elapsed.wholeMicroseconds)) * 1000,
                                                                           user: user)
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
        if !request.more {
            context.logIfSlow(method: request.name, user: user ?? "", elapsed: ContinuousClock.now - started)
        }
    }

    /// Wraps the sink so a transport failure is told apart from a method's own errors.
    private struct ReplyFailed: Error { let underlying: any Error }

    private func dispatch(_ request: Request, peer: PeerIdentity, send: @escaping ReplySink) async throws {
        let guarded: ReplySink = { bytes in
            do { try await send(bytes) } catch { throw ReplyFailed(underlying: error) }
        }
        let interface = request.method?.interface ?? Method.Interface(rawValue: String(request.interfaceName))
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
            throw VarlinkError.interfaceNotFound(String(request.interfaceName))
        }
        guard let method = request.method else { throw VarlinkError.methodNotFound(request.name) }
        switch method.interface {
        case .service: try await ServiceMethods().handle(method, request, send: guarded)
        case .store: try await StoreMethods(context: context).handle(method, request, peer: peer, send: guarded)
        case .admin: try await AdminMethods(context: context).handle(method, request, peer: peer, send: guarded)
        }
    }
}
