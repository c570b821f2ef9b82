import UserStoreClusterServing
import UserStoreConfiguration
import UserStoreInterface
import Varlink

/// Calls forwarded to the host that owns their user (docs/cluster.md): each goes over this
/// connection's link to that host and its reply takes its turn among the connection's replies,
/// as a reply from a store's queue does. A streamed `Query` (`more`) runs alone, like a task
/// call: its parts are relayed as the client reads them. A oneway call goes as an ordinary one
/// (the owner may answer some oneway calls, an error for instance, and the link must see one
/// reply per call), and its reply is dropped here.
///
/// Confined to its connection's event loop (asserted in debug builds); other threads reach it
/// through `loop.execute`.
final class ForwardedCalls: @unchecked Sendable {
    let loop: EventLoop
    let limits: RequestLimits
    let replies: ReplyQueue
    /// The links to other hosts and the transactions open there.
    private let links: ForwardingLinks

    init(forwarder: Forwarder, loop: EventLoop, limits: RequestLimits, replies: ReplyQueue) {
        self.loop = loop
        self.limits = limits
        self.replies = replies
        links = ForwardingLinks(forwarder: forwarder)
    }

    /// The transactions the connection opened on other hosts, by id.
    var transactions: [String: Forwarder.Transaction] { links.transactions }
    /// No call waits for another host.
    var isIdle: Bool { links.isIdle }
    /// Ends links whose oldest call waited too long (`cluster.forwardTimeoutMilliseconds`).
    func sweep(now: UInt64) {
        assert(loop.inEventLoop)
        links.sweep(now: now)
    }

    func closeAll() {
        assert(loop.inEventLoop)
        links.closeAll()
    }

    /// Forwards the call in `view` (`bytes`, without its NUL) as `target` says: ``Session/Route/later``
    /// when it must wait until every earlier reply is out (a streamed call).
    func forward(_ view: JSONView, _ method: Method, _ bytes: UnsafeBufferPointer<UInt8>, to target: Forwarder.Target) -> Session.Route {
        assert(loop.inEventLoop)
        let oneway = view.member("oneway", of: 0).flatMap(view.bool) == true
        let user: String, host: String, address: String
        switch target {
        case .refused(let error):
            if !oneway { replies.append(error) }
            return .done
        case .host(let named, let owner, let reached):
            (user, host, address) = (named, owner, reached)
        }
        let parameters = view.member("parameters", of: 0)
        let transaction = parameters.flatMap { view.member("transaction", of: $0) }.flatMap { view.kind($0) == .string ? view.string($0) : nil }
        // Only a Query outside a transaction streams (the owner answers any other call once).
        let streamed = !oneway && view.member("more", of: 0).flatMap(view.bool) == true && transaction == nil && (method == .query || method == .watch)
        if streamed && !replies.isInOrder { return .later }
        let loop = self.loop
        let maxReplyBytes = max(limits.maxResponseBytes, limits.maxRequestBytes) + (1 << 20)
        guard let link = links.link(to: host, address: address, maxReplyBytes: maxReplyBytes, closed: { [self] link in
            loop.execute { [self] in self.links.ended(link) }
        }) else {
            // A transaction whose link has ended: its owner rolled it back.
            if !oneway { replies.append(Errors.noSuchTransaction(transaction ?? "")) }
            return .done
        }
        var message: [UInt8]
        if oneway {
            // Sent on without `oneway` (the owner's reply ends the call here), its parameters as
            // they came; parameters that are not an object: a oneway call gets no reply.
            let parameters: Int?
            do { parameters = try view.callParameters() } catch { return .done }
            message = Array("{\"method\":\"\(method.rawValue)\"".utf8)
            if let parameters { message += Array(",\"parameters\":".utf8) + view.rawText(parameters) }
            message.append(UInt8(ascii: "}"))
        } else {
            message = Array(bytes)
        }
        message.append(0)
        if streamed {
            let message = message
            return .task { send, end in
                link.send(message, waiter: .stream(user: user, send: { bytes in
                    // A stream refused before its first row may be a WrongHost: made Retry here too.
                    try await send(Self.retryIfMoved(bytes, host: host, user: user))
                }, end: end))
            }
        }
        let kind = InteractiveTransaction.Call(method, view)
        let begins = kind.map { if case .begin = $0 { true } else { false } } ?? false
        let ends = kind.map { if case .end = $0 { true } else { false } } ?? false
        // Every forwarded call takes a turn among the replies (a oneway one with no bytes): the
        // client's reading pauses once too many wait, here as for local calls.
        let reply = replies.reserve()
        link.send(message, waiter: .reply(user: user, deliver: { [self] bytes in
            loop.execute { [self] in
                settleForwarded(reply, oneway ? [] : bytes, host: host, user: user, begins: begins, transaction: transaction, ends: ends,
                                outcome: oneway ? bytes : nil)
            }
        }))
        return .done
    }

    /// Delivers a forwarded call's reply after noting what it says of transactions; a
    /// `WrongHost` from the host it went to (the bucket moved meanwhile) becomes `Retry`:
    /// nothing was done, and the next call goes where the records then say.
    /// `outcome`: the reply of a oneway call, which `bytes` (empty) does not carry to the client.
    private func settleForwarded(_ reply: QueuedReply, _ bytes: [UInt8], host: String, user: String, begins: Bool, transaction: String?, ends: Bool,
                                 outcome: [UInt8]? = nil) {
        let received = outcome ?? bytes
        let isError = received.starts(with: Self.errorPrefix)
        guard isError || begins || ends else { return reply.completeOnLoop(bytes) }
        let (error, parameters) = Self.outcome(of: received)
        let named = error.flatMap(ErrorName.init(rawValue:))
        var bytes = bytes
        if named == .wrongHost {
            if outcome == nil { bytes = Self.retry(movedFrom: host, owner: parameters, user: user) }
        } else {
            if begins, error == nil, let id = parameters?["transaction"]?.stringValue { links.began(id, on: host, user: user) }
            if let transaction, ends || named == .noSuchTransaction || named == .transactionExpired {
                links.ended(transaction: transaction)
            }
        }
        reply.completeOnLoop(bytes)
    }

    /// `Retry` for a `WrongHost` from `host` (the bucket moved while the call travelled:
    /// nothing was done, and the next call goes where the records then say); any other reply
    /// as it is.
    private static func retryIfMoved(_ bytes: [UInt8], host: String, user: String) -> [UInt8] {
        guard bytes.starts(with: errorPrefix) else { return bytes }
        let (error, parameters) = outcome(of: bytes)
        guard error.flatMap(ErrorName.init(rawValue:)) == .wrongHost else { return bytes }
        return retry(movedFrom: host, owner: parameters, user: user)
    }

    /// The `Retry` that replaces `host`'s `WrongHost` (whose `parameters` name the owner).
    private static func retry(movedFrom host: String, owner parameters: [String: JSONValue]?, user: String) -> [UInt8] {
        let owner = parameters?["host"]?.stringValue ?? "another host"
        return VarlinkReply.encode(Errors.retry(user: user, reason: "the call was forwarded to \(host), which no longer owns the user's bucket (\(owner) does); nothing was done"))
    }

    /// How every error reply starts (the daemon writes the name first).
    private static let errorPrefix = Array(#"{"error":"#.utf8)

    /// A reply's error name (nil for a success) and its parameters — parsed only for a
    /// transaction's replies and for errors, which are rare.
    private static func outcome(of reply: [UInt8]) -> (error: String?, parameters: [String: JSONValue]?) {
        guard let message = try? JSONParser().parse(reply.dropLast()), case .object(let fields) = message else { return (nil, nil) }
        let parameters: [String: JSONValue]? = if case .object(let values) = fields["parameters"] { values } else { nil }
        return (fields["error"]?.stringValue, parameters)
    }
}
