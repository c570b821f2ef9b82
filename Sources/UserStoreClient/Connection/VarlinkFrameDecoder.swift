import NIOCore

/// Splits the byte stream into varlink messages: each ends with a NUL byte.
struct VarlinkFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    /// The largest reply accepted; a longer one is a protocol violation (the daemon's own
    /// `limits.maxResponseBytes` is far below it).
    let maxMessageBytes: Int
    /// How far the current partial message was already searched for its NUL.
    private var scanned = 0

    init(maxMessageBytes: Int) {
        self.maxMessageBytes = maxMessageBytes
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let view = buffer.readableBytesView
        guard let end = view.dropFirst(scanned).firstIndex(of: 0) else {
            scanned = view.count
            if scanned > maxMessageBytes {
                throw UserStoreError.protocolViolation("a reply longer than \(maxMessageBytes) bytes")
            }
            return .needMoreData
        }
        let message = buffer.readSlice(length: end - view.startIndex)!
        buffer.moveReaderIndex(forwardBy: 1)
        scanned = 0
        context.fireChannelRead(wrapInboundOut(message))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}
