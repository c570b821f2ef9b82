import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization
import UserStoreConfiguration
import UserStoreProtocol
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// One client connection's link to another daemon (TCP, mutual TLS), over which it forwards the
/// calls for users that host owns. Calls go out in order and their replies come back in order
/// (the other daemon serves the link like any connection: one varlink connection each way), so
/// a reply belongs to the oldest call still waiting — and an interactive transaction forwarded
/// over a link lives on it until it ends.
///
/// Replies are read by one task, which hands each to its waiter; a streamed reply's parts go to
/// the client as fast as it reads them (the link is not read meanwhile: backpressure reaches
/// the owner, which steps its statement only as fast as the link reads).
///
/// When the link fails (the owner cannot be reached, refuses the handshake, closes, or leaves a
/// call unanswered for `cluster.forwardTimeoutMilliseconds`), every call still waiting gets
/// `HostUnreachable`, with `maybeApplied` true when it had reached the owner.
package final class PeerLink: Sendable {
    /// Who waits for a reply.
    package enum Waiter: Sendable {
        /// One reply.
        case reply(user: String, deliver: @Sendable ([UInt8]) -> Void)
        /// Replies until one without `continues`; `send` may wait (the client reads slowly) and
        /// throws when the client is gone; `end` runs after the last.
        case stream(user: String, send: @Sendable ([UInt8]) async throws -> Void, end: @Sendable () -> Void)

        var user: String {
            switch self {
            case .reply(let user, _), .stream(let user, _, _): user
            }
        }
    }

    package let host: String
    package let address: String
    private let state = Mutex(State())

    private struct State {
        var channel: (any Channel)?
        /// Written before the connection was up, in order.
        var queued: [ByteBuffer] = []
        var waiters = CircularBuffer<Waiter>()
        /// When the oldest waiter last made progress (sent, or a part of its stream arrived).
        var progress: UInt64 = 0
        /// The TLS handshake completed: what was written may have reached the owner.
        var handshaken = false
        /// A streamed reply's part is on its way to a client that reads slowly: waiting on the
        /// client is not the owner's silence (the client's own connection has its limit).
        var relaying = false
        /// Why the link ended, once it has.
        var ended: String?
    }

    /// Opens the link (in the background: calls sent meanwhile wait for it). `closed` runs once
    /// it has ended and every waiter has been answered.
    package init(host: String, address: String, tls: NIOSSLContext, maxReplyBytes: Int, closed: @escaping @Sendable (PeerLink) -> Void) {
        self.host = host
        self.address = address
        Task { [self] in
            let reason = await run(tls: tls, maxReplyBytes: maxReplyBytes)
            fail(reason)
            closed(self)
        }
    }

    /// Sends `message` (a NUL-terminated call); its replies go to `waiter` (nil: a oneway call).
    package func send(_ message: [UInt8], waiter: Waiter?) {
        let buffer = ByteBuffer(bytes: message)
        let refused = state.withLock { state -> String? in
            if let ended = state.ended { return ended }
            if let waiter {
                if state.waiters.isEmpty { state.progress = StoreClock.now() }
                state.waiters.append(waiter)
            }
            if let channel = state.channel {
                channel.writeAndFlush(buffer, promise: nil)
            } else {
                state.queued.append(buffer)
            }
            return nil
        }
        if let refused, let waiter { Self.answer(waiter, PeerLink.hostUnreachable(user: waiter.user, host: host, address: address, message: refused, maybeApplied: false)) }
    }

    /// The link has ended (its waiters are answered or about to be): no call goes over it.
    package var hasEnded: Bool { state.withLock { $0.ended != nil } }

    /// Nothing is waiting for a reply.
    package var isIdle: Bool { state.withLock { $0.waiters.isEmpty } }

    /// Ends the link when its oldest call has waited longer than `timeout` nanoseconds: every
    /// waiter is answered now (not once the owner, which may be paused, lets the TLS close end).
    package func sweep(now: UInt64, timeout: UInt64) {
        guard let channel = state.withLock({ state -> (any Channel)? in
            guard !state.waiters.isEmpty, state.ended == nil, !state.relaying, now > state.progress, now - state.progress > timeout else { return nil }
            state.ended = "no reply from host \(host) within \(timeout / 1_000_000) ms (cluster.forwardTimeoutMilliseconds)"
            return state.channel
        }) else { return }
        fail("")
        channel.close(promise: nil)
    }

    /// Ends the link (its client went away): the owner rolls back a transaction open on it.
    package func close() {
        let channel = state.withLock { state -> (any Channel)? in
            if state.ended == nil { state.ended = "the client's connection closed" }
            return state.channel
        }
        channel?.close(promise: nil)
    }

    // MARK: The reading task

    /// Connects, writes what was queued, and hands every reply to its waiter until the link
    /// ends; returns why it ended.
    private func run(tls: NIOSSLContext, maxReplyBytes: Int) async -> String {
        guard let target = HostPort(address) else { return "host \(host)'s address '\(address)' is not host:port" }
        // A name is checked against the certificate; an IP address against its IP SANs.
        let serverName: String? = SocketAddressCheck.isIPAddress(target.host) ? nil : target.host
        let link: NIOAsyncChannel<ByteBuffer, ByteBuffer>
        do {
            link = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .peerKeepalive()
                .connectTimeout(.seconds(5))
                .connect(host: target.host, port: target.port) { [self] channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: serverName))
                        try channel.pipeline.syncOperations.addHandler(HandshakeWatcher { [self] in state.withLock { $0.handshaken = true } })
                        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(NULFrameDecoder(maximum: maxReplyBytes)))
                        return try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            return "cannot connect to host \(host) at \(address): \(error)"
        }
        let ended = state.withLock { state -> String? in
            guard state.ended == nil else { return state.ended }
            state.channel = link.channel
            for buffer in state.queued { link.channel.write(buffer, promise: nil) }
            state.queued.removeAll()
            link.channel.flush()
            return nil
        }
        if let ended {
            try? await link.channel.close()
            return ended
        }
        var tape = JSONTape()
        do {
            try await link.executeThenClose { inbound, _ in
                for try await frame in inbound {
                    guard try await dispatch(Array(frame.readableBytesView), &tape) else { break }
                }
            }
        } catch {
            return state.withLock { $0.ended } ?? "the link to host \(host) failed: \(error)"
        }
        return state.withLock { $0.ended } ?? "host \(host) closed the link"
    }

    /// Hands one reply to the oldest waiter; false when the link must end (a reply nobody
    /// waits for, the link ended meanwhile, or a stream's client gone: the owner stops
    /// streaming once the link closes).
    private func dispatch(_ reply: [UInt8], _ tape: inout JSONTape) async throws -> Bool {
        guard let waiter = state.withLock({ $0.waiters.first }) else {
            state.withLock { if $0.ended == nil { $0.ended = "host \(host) sent a reply to no call" } }
            return false
        }
        var last = true
        if case .stream = waiter { last = !Self.continues(reply, &tape) }
        // Taken (or, for a stream's part, marked as being relayed) under the lock, unless the
        // sweep ended the link and answered the waiter meanwhile.
        let still = state.withLock { state -> Bool in
            guard state.ended == nil, !state.waiters.isEmpty else { return false }
            if last { _ = state.waiters.removeFirst() }
            state.progress = StoreClock.now()
            if case .stream = waiter { state.relaying = true }
            return true
        }
        guard still else { return false }
        switch waiter {
        case .reply(_, let deliver):
            deliver(reply)
        case .stream(_, let send, let end):
            do {
                try await send(reply)
            } catch {
                state.withLock { state in
                    if !last, !state.waiters.isEmpty { _ = state.waiters.removeFirst() }
                    if state.ended == nil { state.ended = "the client stopped reading a streamed reply" }
                    state.relaying = false
                }
                end()
                return false
            }
            state.withLock { state in
                state.relaying = false
                state.progress = StoreClock.now()
            }
            if last { end() }
        }
        return true
    }

    /// Whether a reply says more replies follow (`"continues": true`).
    private static func continues(_ reply: [UInt8], _ tape: inout JSONTape) -> Bool {
        reply.withUnsafeBufferPointer { buffer in
            let message = UnsafeBufferPointer(rebasing: buffer.dropLast()) // the NUL
            guard (try? tape.parse(message)) != nil else { return false }
            return tape.withView(message) { view in
                view.kind(0) == .object && view.member("continues", of: 0).flatMap(view.bool) == true
            }
        }
    }

    /// Answers every waiter left with `HostUnreachable` (the reason the link ended, or
    /// `reason` if it has not).
    private func fail(_ reason: String) {
        let (waiters, reached) = state.withLock { state -> ([Waiter], Bool) in
            if state.ended == nil { state.ended = reason }
            defer { state.waiters.removeAll() }
            return (Array(state.waiters), state.handshaken)
        }
        let message = state.withLock { $0.ended } ?? reason
        for waiter in waiters {
            Self.answer(waiter, PeerLink.hostUnreachable(user: waiter.user, host: host, address: address, message: message, maybeApplied: reached))
        }
    }

    private static func answer(_ waiter: Waiter, _ error: VarlinkError) {
        let bytes = VarlinkReply.encode(error)
        switch waiter {
        case .reply(_, let deliver):
            deliver(bytes)
        case .stream(_, let send, let end):
            Task {
                try? await send(bytes)
                end()
            }
        }
    }
}

/// Cuts NUL-terminated varlink messages (each with its NUL) from the bytes of a link,
/// refusing one longer than `maximum`.
struct NULFrameDecoder: ByteToMessageDecoder {
    package typealias InboundOut = ByteBuffer

    package let maximum: Int
    /// Bytes of the readable part already searched for a NUL.
    private var scanned = 0

    package init(maximum: Int) {
        self.maximum = maximum
    }

    package struct TooLong: Error, CustomStringConvertible {
        let maximum: Int
        var description: String { "a reply longer than \(maximum) bytes" }
    }

    package mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let start = scanned
        let found = buffer.withUnsafeReadableBytes { bytes -> Int? in
            guard bytes.count > start, let hit = memchr(bytes.baseAddress! + start, 0, bytes.count - start) else { return nil }
            return bytes.baseAddress!.distance(to: UnsafeRawPointer(hit))
        }
        guard let found else {
            scanned = buffer.readableBytes
            if scanned > maximum { throw TooLong(maximum: maximum) }
            return .needMoreData
        }
        guard found <= maximum else { throw TooLong(maximum: maximum) }
        scanned = 0
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: found + 1)!))
        return .continue
    }
}

/// Tells when the TLS handshake of a link completed.
private final class HandshakeWatcher: ChannelInboundHandler, RemovableChannelHandler {
    package typealias InboundIn = NIOAny
    private let completed: @Sendable () -> Void

    package init(_ completed: @escaping @Sendable () -> Void) {
        self.completed = completed
    }

    package func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event { completed() }
        context.fireUserInboundEventTriggered(event)
    }
}

enum SocketAddressCheck {
    /// Whether `host` is an IPv4 or IPv6 literal (not a name).
    package static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr(), v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }
}

extension ClientBootstrap {
    /// TCP keepalive on a link: a peer host that died or was cut off is noticed within about
    /// 25 s (10 s idle, then 3 probes 5 s apart), and its connection closed.
    package func peerKeepalive() -> ClientBootstrap {
        channelOption(.socketOption(.so_keepalive), value: 1)
            .channelOption(.tcpOption(.init(rawValue: TCP_KEEPIDLE)), value: 10)
            .channelOption(.tcpOption(.init(rawValue: TCP_KEEPINTVL)), value: 5)
            .channelOption(.tcpOption(.init(rawValue: TCP_KEEPCNT)), value: 3)
    }
}

extension ServerBootstrap {
    /// TCP keepalive on a peer's connection (``ClientBootstrap/peerKeepalive()``): a forwarding
    /// host that died or was cut off does not leave its connections here for good (they are
    /// exempt from the idle time-out).
    package func peerKeepalive() -> ServerBootstrap {
        childChannelOption(.socketOption(.so_keepalive), value: 1)
            .childChannelOption(.tcpOption(.init(rawValue: TCP_KEEPIDLE)), value: 10)
            .childChannelOption(.tcpOption(.init(rawValue: TCP_KEEPINTVL)), value: 5)
            .childChannelOption(.tcpOption(.init(rawValue: TCP_KEEPCNT)), value: 3)
    }
}

extension PeerLink {
    /// More than one host: a call forwarded to the owner of the user's bucket got no reply —
    /// the owner could not be reached, refused the link, or did not answer in time.
    /// `maybeApplied`: the call had reached the owner (its outcome is unknown); false: it was
    /// never sent, nothing was done.
    package static func hostUnreachable(user: String, host: String, address: String, message: String, maybeApplied: Bool) -> VarlinkError {
        VarlinkError(.hostUnreachable, [
            "user": .string(user), "host": .string(host), "address": .string(address), "message": .string(message), "maybeApplied": .bool(maybeApplied),
        ])
    }
}
