import Varlink

/// Calls forwarded to the host that owns their user (docs/cluster.md): each goes over this
/// connection's link to that host and its reply takes its turn among the connection's replies,
/// as a reply from a store's queue does. A streamed call (`more`) runs alone, like a task call:
/// its parts are relayed as the client reads them.
extension Connection {
    /// Forwards the call in `view` (`bytes`, without its NUL) as `target` says; false when it
    /// must wait until every earlier reply is out (a streamed call).
    func forward(_ view: JSONView, _ bytes: UnsafeBufferPointer<UInt8>, to target: Forwarder.Target) -> Bool {
        let user: String, host: String, address: String
        switch target {
        case .refused(let error):
            appendReply(error)
            return true
        case .host(let named, let owner, let reached):
            (user, host, address) = (named, owner, reached)
        }
        let oneway = view.member("oneway", of: 0).flatMap(view.bool) == true
        let streamed = !oneway && view.member("more", of: 0).flatMap(view.bool) == true
        if streamed && !pending.isEmpty { return false }
        let links = forwarding ?? ForwardingLinks(forwarder: shared.forwarder!)
        forwarding = links
        let loop = self.loop
        let maxReplyBytes = max(limits.maxResponseBytes, limits.maxRequestBytes) + (1 << 20)
        guard let link = links.link(to: host, address: address, maxReplyBytes: maxReplyBytes, closed: { [self] link in
            loop.execute { [self] in forwarding?.ended(link) }
        }) else {
            // A transaction whose link ended between the lookup and now: its owner rolled it back.
            appendReply(Errors.hostUnreachable(user: user, host: host, address: address, message: "the link to host \(host) ended", maybeApplied: true))
            return true
        }
        var message = Array(bytes)
        message.append(0)
        if oneway {
            link.send(message, waiter: nil)
            return true
        }
        if streamed {
            taskRunning = true
            flushOut() // earlier replies go first
            link.send(message, waiter: .stream(user: user, send: { [self] bytes in try await sendFromTask(bytes) }, end: { [self] in
                loop.execute { [self] in
                    taskRunning = false
                    if !closed { resume() }
                }
            }))
            return true
        }
        let kind = Self.transactionCall(view)
        let transaction = view.member("parameters", of: 0).flatMap { view.member("transaction", of: $0) }
            .flatMap { view.kind($0) == .string ? view.string($0) : nil }
        let reply = makeQueuedReply()
        link.send(message, waiter: .reply(user: user, deliver: { [self] bytes in
            loop.execute { [self] in
                settleForwarded(reply, bytes, host: host, user: user, begins: kind.map { if case .begin = $0 { true } else { false } } ?? false,
                                transaction: transaction, ends: kind.map { if case .end = $0 { true } else { false } } ?? false)
            }
        }))
        return true
    }

    /// Delivers a forwarded call's reply after noting what it says of transactions; a
    /// `WrongHost` from the host it went to (the bucket moved meanwhile) becomes `Retry`:
    /// nothing was done, and the next call goes where the records then say.
    private func settleForwarded(_ reply: QueuedReply, _ bytes: [UInt8], host: String, user: String, begins: Bool, transaction: String?, ends: Bool) {
        var bytes = bytes
        let isError = bytes.starts(with: Self.errorPrefix)
        guard isError || begins || ends else { return deliver(reply, bytes) }
        let (error, parameters) = Self.outcome(of: bytes)
        if error == "io.userstore.Store.WrongHost" {
            let owner = parameters?["host"]?.stringValue ?? "another host"
            bytes = VarlinkReply.encode(Errors.retry(user: user, reason: "the call was forwarded to \(host), which no longer owns the user's bucket (\(owner) does); nothing was done"))
        } else if let forwarding {
            if begins, error == nil, let id = parameters?["transaction"]?.stringValue { forwarding.began(id, on: host, user: user) }
            if let transaction, ends || error == "io.userstore.Store.NoSuchTransaction" || error == "io.userstore.Store.TransactionExpired" {
                forwarding.ended(transaction: transaction)
            }
        }
        deliver(reply, bytes)
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
