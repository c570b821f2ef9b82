import Foundation

/// The replica's writer lease (`userstore-lease.json` at its root), with one host (no
/// `cluster` section): which host may write to the replica and acknowledge durable writes, at
/// which epoch (docs/replication.md, "One writer"). Taken and renewed by compare-and-swap
/// (``LeaseKeeper``); every store this host replicates goes under `<user>/e<epoch>`, so what a
/// host that lost the lease uploads late lands where no restore reads once the new holder wrote.
package struct ReplicaLease: Codable, Sendable, Equatable {
    /// Its object name at the replica's root.
    package static let name = "userstore-lease.json"

    /// The holder's host name.
    package var holder: String
    /// The holder's data directory (``ReplicaBinding/dataDirectory``): a daemon that finds its
    /// own directory's lease after a restart takes it back at once, at the same epoch.
    package var dataDirectory: String
    /// The holding process (random per start).
    package var incarnation: String
    /// Grows with every new holder: at least the Unix time it was taken at, so that epochs keep
    /// growing even if the lease object itself were lost.
    package var epoch: Int64
    /// `replication.leaseSeconds` of the holder.
    package var leaseSeconds: Int
    package var acquiredAt: String
    package var renewedAt: String
    /// `renewedAt` plus `leaseSeconds`, by the holder's clock (for operators: another host takes
    /// the lease over only after it has itself seen the lease unchanged for `leaseSeconds`).
    package var expiresAt: String
    /// Renewals since it was taken: every write of the lease differs from the one before.
    package var renewals: Int64
    /// The holder stopped cleanly and gave it up: another host may take it at once.
    package var released: Bool?
    /// The holding process (boot, pid, start time): a daemon on the same machine that finds it
    /// gone takes the lease at once.
    package var process: ProcessIdentity?

    package var json: Data { (try? ReplicaMarker.encoder.encode(self)) ?? Data() }

    package init?(json: Data) {
        guard let lease = try? JSONDecoder().decode(Self.self, from: json) else { return nil }
        self = lease
    }

    init(holder: String, dataDirectory: String, incarnation: String, epoch: Int64, leaseSeconds: Int, now: Date) {
        self.holder = holder
        self.dataDirectory = dataDirectory
        self.incarnation = incarnation
        self.epoch = epoch
        self.leaseSeconds = leaseSeconds
        acquiredAt = RFC3339.format(now)
        renewedAt = acquiredAt
        expiresAt = RFC3339.format(now.addingTimeInterval(TimeInterval(leaseSeconds)))
        renewals = 0
        process = ProcessIdentity.current
    }

    /// The same lease renewed at `now` (or given up, with `released`).
    func renewed(at now: Date, released: Bool = false) -> ReplicaLease {
        var lease = self
        lease.renewals += 1
        lease.renewedAt = RFC3339.format(now)
        lease.expiresAt = RFC3339.format(released ? now : now.addingTimeInterval(TimeInterval(leaseSeconds)))
        lease.released = released ? true : nil
        return lease
    }

    /// How an operator reads it: `host-a (epoch 1764…, renewed at …, expires at …)`.
    package var summary: String {
        "\(holder) (epoch \(epoch), renewed at \(renewedAt), \(released == true ? "released" : "expires at \(expiresAt)"))"
    }

    /// The epoch a new holder takes after `previous`: one more, and at least the Unix time now.
    static func nextEpoch(after previous: Int64?, now: Date) -> Int64 {
        max((previous ?? 0) + 1, Int64(now.timeIntervalSince1970))
    }
}
