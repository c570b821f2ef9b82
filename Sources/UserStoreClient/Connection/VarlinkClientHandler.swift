import NIOCore
import Varlink

/// A call on its way to the daemon: its message (NUL included) and who takes its replies.
struct OutgoingCall {
    let message: ByteBuffer
    let responder: Responder
}

/// Who takes a call's replies.
enum Responder {
    /// One reply: its parameters (or the error it is).
    case single(EventLoopPromise<[String: JSONValue]>)
    /// Replies until one comes without `continues` (a call with `more`).
    case stream(RowStreamSink)

    func fail(_ error: any Error) {
        switch self {
        case .single(let promise): promise.fail(error)
        case .stream(let sink): sink.fail(error)
        }
    }
}

/// Varlink's client side of one connection: calls go out in order, and since the daemon answers
/// a connection's calls in the order they came, each reply belongs to the oldest call still
/// waiting. Any number of calls may be in flight at once (pipelining).
///
/// Runs on the channel's event loop only.
final class VarlinkClientHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = OutgoingCall
    typealias OutboundOut = ByteBuffer

    private var waiting = CircularBuffer<Responder>(initialCapacity: 16)
    private var closed = false
    private let parser = JSONParser(maxDepth: 512)

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let call = unwrapOutboundIn(data)
        guard !closed else {
            call.responder.fail(NotSent())
            promise?.fail(NotSent())
            return
        }
        waiting.append(call.responder)
        context.write(wrapOutboundOut(call.message), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let message = unwrapInboundIn(data)
        let reply: VarlinkReplyMessage
        do {
            reply = try message.withUnsafeReadableBytes { bytes in
                try VarlinkReplyMessage(message: parser.parse(bytes.bindMemory(to: UInt8.self)))
            }
        } catch {
            return violation(context, "an unreadable reply: \(error)")
        }
        guard let responder = waiting.first else { return violation(context, "a reply to no call") }
        let error = reply.error.map { UserStoreError(daemonError: $0, parameters: reply.parameters) }
        switch responder {
        case .single(let promise):
            waiting.removeFirst()
            guard !reply.continues else { return violation(context, "a reply with continues to a call without more") }
            if let error { promise.fail(error) } else { promise.succeed(reply.parameters) }
        case .stream(let sink):
            if !reply.continues || error != nil { waiting.removeFirst() }
            if let error { sink.fail(error); return }
            let more = sink.receive(reply.parameters, last: !reply.continues)
            if !more { context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        failAll(UserStoreError.closed("the daemon closed the connection before replying; the call may or may not have run"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        failAll(error as? UserStoreError ?? UserStoreError.closed("connection error: \(error); the call may or may not have run"))
        context.close(promise: nil)
    }

    private func violation(_ context: ChannelHandlerContext, _ detail: String) {
        failAll(UserStoreError.protocolViolation(detail))
        context.close(promise: nil)
    }

    private func failAll(_ error: any Error) {
        closed = true
        while let responder = waiting.popFirst() { responder.fail(error) }
    }
}

/// The call never left: the connection had closed already. Safe to send again elsewhere.
struct NotSent: Error {}
