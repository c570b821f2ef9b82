import NIOCore

/// Joins two channels of one event loop: what one reads, the other writes, with backpressure
/// (a side reads only while its partner can take the bytes), half-closure and closure passed
/// across. Bytes read before the partner is in place are kept and written once it is.
///
/// The peer listener joins a TLS connection from another daemon to one end of a socket pair
/// whose other end the daemon serves like a local client.
final class GlueHandler: ChannelDuplexHandler {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny
    typealias OutboundOut = NIOAny

    private var partner: GlueHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false
    /// Read before the partner was added to its channel.
    private var early: [NIOAny] = []
    private var earlyEnd = false

    private init() {}

    /// Two handlers, each the other's partner. Both must be added to channels of one event loop.
    static func pair() -> (GlueHandler, GlueHandler) {
        let first = GlueHandler(), second = GlueHandler()
        first.partner = second
        second.partner = first
        return (first, second)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        partner?.partnerAdded()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner?.partner = nil // it stops keeping what it reads for this side
        partner = nil
        early.removeAll()
    }

    /// The partner is in its channel: it takes what arrived before it.
    private func partnerAdded() {
        guard let partner, partner.context != nil else { return }
        if !early.isEmpty {
            for data in early { partner.partnerWrite(data) }
            early.removeAll()
            partner.partnerFlush()
        }
        if earlyEnd { partner.partnerCloseFull() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard let partner else { return } // the partner is gone: nothing will take it
        guard partner.context != nil else {
            early.append(data)
            return
        }
        partner.partnerWrite(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        partner?.partnerFlush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        guard let partner, partner.context != nil else {
            earlyEnd = true
            return
        }
        partner.partnerCloseFull()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, case .inputClosed = event {
            partner?.partnerWriteEOF()
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        partner?.partnerCloseFull()
        context.close(promise: nil)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.partnerBecameWritable() }
    }

    func read(context: ChannelHandlerContext) {
        if let partner, partner.context != nil, !partner.partnerWritable {
            pendingRead = true
        } else {
            context.read()
        }
    }

    // MARK: Called by the partner (same event loop)

    private func partnerWrite(_ data: NIOAny) { context?.write(data, promise: nil) }

    private func partnerFlush() { context?.flush() }

    private func partnerWriteEOF() { context?.close(mode: .output, promise: nil) }

    private func partnerCloseFull() { context?.close(promise: nil) }

    private func partnerBecameWritable() {
        if pendingRead {
            pendingRead = false
            context?.read()
        }
    }

    private var partnerWritable: Bool { context?.channel.isWritable ?? false }
}
