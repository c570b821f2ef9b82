import NIOSSL
import UserStoreCluster
import UserStoreConfiguration
import UserStoreCore
import UserStoreInterface
import Varlink

/// Decides which calls a client connection sends to another host (`cluster.forward`,
/// docs/cluster.md), from this daemon's copy of the bucket and host records: an
/// `io.userstore.Store` call naming a user whose bucket another host owns, or naming a
/// transaction the connection opened there. Everything else is served here as on one host
/// (where a user this host does not own gets `WrongHost`, `Retry` or `ClusterUnavailable`).
///
/// Clients need not know the cluster exists: they keep talking to their local daemon.
package final class Forwarder: Sendable {
    package let host: String
    package let buckets: PrefixMirror<BucketRecord>
    package let hosts: PrefixMirror<HostRecord>
    package let tls: NIOSSLContext
    /// `cluster.forwardTimeoutMilliseconds`, in nanoseconds.
    package let timeout: UInt64

    package init(host: String, buckets: PrefixMirror<BucketRecord>, hosts: PrefixMirror<HostRecord>, tls: NIOSSLContext, timeoutMilliseconds: Int) {
        self.host = host
        self.buckets = buckets
        self.hosts = hosts
        self.tls = tls
        timeout = UInt64(timeoutMilliseconds) * 1_000_000
    }

    /// Where a forwarded call goes.
    package enum Target {
        /// To `host`, reached at `address` (empty for a call naming a transaction open there:
        /// it goes over the link the transaction lives on), for `user`.
        case host(user: String, host: String, address: String)
        /// Nowhere: answered here with this error (the owner is known but has no live record).
        case refused(VarlinkError)
    }

    /// A transaction a connection opened on another host.
    package struct Transaction {
        package let host: String
        package let user: String
    }

    /// Where the call in `view`, of `method`, from a peer the access rules grant `grant` goes,
    /// or nil: it is served here. `transactions`: those the connection opened elsewhere, by id.
    package func target(of view: JSONView, _ method: Method, grant: AccessRules.Grant, transactions: [String: Transaction]) -> Target? {
        guard method.interface == .store,
              let call = view.member("parameters", of: 0), view.kind(call) == .object else { return nil }
        if let named = view.member("transaction", of: call), view.kind(named) == .string {
            // A transaction is served where it was begun (an unknown id: here, NoSuchTransaction).
            return transactions[view.string(named)].map { .host(user: $0.user, host: $0.host, address: "") }
        }
        // The access rules apply here first: a call this daemon would refuse is refused here.
        guard grant.store, let token = view.member("user", of: call), view.kind(token) == .string,
              let user = try? UserID(view.string(token)), grant.onlyStore == nil || grant.onlyStore == user.rawValue,
              let owner = buckets["\(Placement.bucket(for: user))"]?.value.owner, owner != host else { return nil }
        guard let address = hosts[owner]?.value.address else {
            return .refused(StoreError.clusterUnavailable(user: user, message: "bucket \(Placement.bucket(for: user))'s owner \(owner) has no live lease; its buckets are being given to other hosts").varlinkError)
        }
        return .host(user: user.rawValue, host: owner, address: address)
    }
}

/// One client connection's links to other hosts and the transactions it opened there.
/// Confined to the connection's event loop, like the connection.
package final class ForwardingLinks {
    package private(set) var links: [String: PeerLink] = [:]
    package private(set) var transactions: [String: Forwarder.Transaction] = [:]
    private let forwarder: Forwarder

    package init(forwarder: Forwarder) {
        self.forwarder = forwarder
    }

    /// The link to `host` (opened now if there is none), or nil for a transaction's host whose
    /// link has ended.
    package func link(to host: String, address: String, maxReplyBytes: Int, closed: @escaping @Sendable (PeerLink) -> Void) -> PeerLink? {
        if let link = links[host] {
            guard link.hasEnded else { return link }
            ended(link) // its transactions with it; a new link for anything else
        }
        guard !address.isEmpty else { return nil }
        let link = PeerLink(host: host, address: address, tls: forwarder.tls, maxReplyBytes: maxReplyBytes, closed: closed)
        links[host] = link
        return link
    }

    /// Forgets `link` once it has ended, with the transactions open over it (their owner rolled
    /// them back when the link closed).
    package func ended(_ link: PeerLink) {
        guard links[link.host] === link else { return }
        links[link.host] = nil
        transactions = transactions.filter { $0.value.host != link.host }
    }

    package func began(_ id: String, on host: String, user: String) { transactions[id] = Forwarder.Transaction(host: host, user: user) }

    package func ended(transaction id: String) { transactions[id] = nil }

    /// No call waits for another host.
    package var isIdle: Bool { links.values.allSatisfy(\.isIdle) }

    /// Ends links whose oldest call waited too long (`cluster.forwardTimeoutMilliseconds`).
    package func sweep(now: UInt64) {
        for link in links.values { link.sweep(now: now, timeout: forwarder.timeout) }
    }

    package func closeAll() {
        for link in links.values { link.close() }
        links.removeAll()
        transactions.removeAll()
    }
}
