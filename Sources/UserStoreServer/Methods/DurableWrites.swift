import UserStoreCore
import UserStoreReplication
import Varlink

/// Durable writes (docs/replication.md): an `Execute`, `Batch` or `Commit` that replies only
/// once the log object holding its transaction (and every earlier one of its store) is stored — for every write with
/// `replication.durableWrites`, or for a call with `durable: true`.
extension DaemonContext {
    /// Whether the write call in `view` (parameters at `call`) must wait for the replica.
    /// Throws `ReplicationUnavailable` for `durable: true` with replication off (before it
    /// runs: nothing is written), and `InvalidParameter` for a `durable` that is not a boolean.
    func isDurable(_ view: JSONView, _ call: Int?, user: String) throws(VarlinkError) -> Bool {
        var asked = false
        if let call, let token = view.member("durable", of: call) {
            switch view.kind(token) {
            case .true: asked = true
            case .false, .null: break
            default: throw .invalidParameter("durable")
            }
        }
        guard let replicator else {
            guard !asked else {
                throw Errors.replicationUnavailable(user: user, message: "durable: true needs replication, which is off (no replication section in the configuration)")
            }
            return false
        }
        return asked || replicator.settings.durableWrites
    }

    /// `reply` (`{"parameters":{…}}` and its NUL, as the daemon writes a reply that is not
    /// streamed) with `fields` added to its parameters.
    static func adding(_ fields: [String: JSONValue], to reply: [UInt8]) -> [UInt8] {
        let close = reply.count - 3 // the parameters' closing brace, before "}" and the NUL
        guard close > 0, reply[close] == UInt8(ascii: "}"), reply[close + 1] == UInt8(ascii: "}") else { return reply }
        var writer = JSONWriter()
        writer.write(.object(fields))
        var inner = writer.bytes.dropFirst().dropLast() // without the object's own braces
        if reply[close - 1] != UInt8(ascii: "{") { inner.insert(UInt8(ascii: ","), at: inner.startIndex) }
        return Array(reply[..<close]) + inner + reply[close...]
    }

    /// Waits until `user`'s committed transactions are in the replica, when `reply` (already
    /// encoded) is not an error; returns the reply, or `ReplicationUnavailable`'s (with more
    /// than one host, `ClusterUnavailable`'s when ownership cannot be confirmed after it).
    func replyWhenReplicated(_ user: UserID, _ reply: [UInt8]) async -> [UInt8] {
        guard let replicator, DaemonMetrics.outcome(of: reply[...]) == nil else { return reply }
        do {
            // The time-out bounds the whole wait, from the commit to the reply.
            try await replicator.waitUntilReplicated(user, until: replicator.durableDeadline)
            // More than one host: acknowledged only if this host still owns the user's bucket at
            // the epoch it replicates under (a linearizable read), and its lease is confirmed.
            guard let cluster else { return reply }
            let epoch = try await cluster.confirmOwnership(of: user, epoch: replicator.registeredEpoch(of: user))
            // Who acknowledged it, at which epoch: what a client (or the cluster harness's
            // history checker) needs to tell one owner's acknowledgements from another's.
            return Self.adding(["host": .string(cluster.settings.host), "epoch": .integer(epoch)], to: reply)
        } catch let error as StoreError {
            return VarlinkReply.encode(error.varlinkError)
        } catch {
            return VarlinkReply.encode(Errors.replicationUnavailable(user: user.rawValue, message: "\(error)"))
        }
    }
}
