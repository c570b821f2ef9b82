import NIOCore
import Varlink

/// Splits the byte stream into varlink messages (each ends with a NUL byte) with the protocol's
/// own ``MessageFramer``, which the daemon uses too.
struct VarlinkFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    /// Finds each message's NUL, searching a long message's bytes once however many reads it takes.
    private var framer: MessageFramer

    /// `maxMessageBytes`: the longest reply accepted; a longer one is a protocol violation (the
    /// daemon's own `limits.maxResponseBytes` is far below it).
    init(maxMessageBytes: Int) {
        framer = MessageFramer(maxMessageBytes: maxMessageBytes)
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        var framer = self.framer
        let next = buffer.withUnsafeReadableBytes { framer.next(in: $0) }
        self.framer = framer
        switch next {
        case .needMore:
            return .needMoreData
        case .tooLarge:
            throw UserStoreError.protocolViolation("a reply longer than \(framer.maxMessageBytes) bytes")
        case .message(let length):
            let message = buffer.readSlice(length: length)!
            buffer.moveReaderIndex(forwardBy: 1)
            context.fireChannelRead(wrapInboundOut(message))
            return .continue
        }
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}
