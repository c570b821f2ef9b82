import NIOCore

/// One inbound varlink message, or the news that a message exceeded the size limit.
enum InboundFrame: Sendable {
    case message(ByteBuffer)
    case tooLarge
}

/// Splits the byte stream into NUL-terminated messages, never buffering more than
/// `maxMessageBytes` of an unfinished one: a client sending hundreds of MiB without a NUL gets
/// ``InboundFrame/tooLarge`` (and is disconnected) instead of growing the daemon's memory.
struct NULFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = InboundFrame

    let maxMessageBytes: Int
    /// Bytes already searched for a NUL, so a message arriving in many reads is scanned once.
    private var scanned = 0
    private var overflowed = false

    init(maxMessageBytes: Int) {
        self.maxMessageBytes = maxMessageBytes
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        if overflowed {
            buffer.moveReaderIndex(forwardBy: buffer.readableBytes)
            return .needMoreData
        }
        let view = buffer.readableBytesView
        let searchStart = view.index(view.startIndex, offsetBy: scanned)
        if let nul = view[searchStart...].firstIndex(of: 0) {
            let length = nul - view.startIndex
            scanned = 0
            if length > maxMessageBytes { return overflow(context: context, buffer: &buffer) }
            let message = buffer.readSlice(length: length)!
            buffer.moveReaderIndex(forwardBy: 1)
            context.fireChannelRead(wrapInboundOut(.message(message)))
            return .continue
        }
        scanned = view.count
        if view.count > maxMessageBytes { return overflow(context: context, buffer: &buffer) }
        return .needMoreData
    }

    private mutating func overflow(context: ChannelHandlerContext, buffer: inout ByteBuffer) -> DecodingState {
        overflowed = true
        buffer.moveReaderIndex(forwardBy: buffer.readableBytes)
        context.fireChannelRead(wrapInboundOut(.tooLarge))
        return .needMoreData
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        // A message cut off by the peer's close is dropped: there is nobody to answer.
        buffer.moveReaderIndex(forwardBy: buffer.readableBytes)
        return .needMoreData
    }
}
