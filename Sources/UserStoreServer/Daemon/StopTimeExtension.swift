import Synchronization

/// Asks systemd for the time a stop may take while it waits for the replica, so that
/// `TimeoutStopSec=` (120 s in the shipped unit) does not SIGKILL it half-way: with a long
/// `replication.durableTimeoutMilliseconds` (up to 10 minutes) a stop during a slow or failing
/// replica waits that long for the requests in flight and again for the log to store the
/// stores' last commits. Killed, the daemon would keep its writer lease until it ran out (the
/// next host waits) and log no `daemon-stopped`; no data is lost either way (the WALs hold it).
///
/// From the stop's beginning it sends `EXTEND_TIMEOUT_USEC` every ``step`` until ``bound`` has
/// passed or the stop has ended. systemd then kills the daemon no earlier than its own
/// time-out and no earlier than ``grace`` after the last extension — a stop that hangs beyond
/// the bound is still ended by systemd. Without systemd (`NOTIFY_SOCKET` unset) it sends nothing.
final class StopTimeExtension: Sendable {
    /// How often the extension is renewed.
    static let step = Duration.seconds(5)
    /// What each extension grants past its sending: a missed renewal or two costs nothing.
    static let grace = Duration.seconds(15)

    /// How long after the stop began the extensions go on.
    let bound: Duration
    private let notifier: SystemdNotifier
    private let sender = Mutex<Task<Void, Never>?>(nil)

    /// For a daemon whose replica waits at most `durableTimeout` at a time: the requests in
    /// flight (a durable write waits that long), the log's last flush (as long again), and a
    /// minute for the rest (closing the stores, leaving the cluster, giving the lease up).
    init(durableTimeout: Duration, notifier: SystemdNotifier) {
        self.bound = durableTimeout * 2 + .seconds(60)
        self.notifier = notifier
    }

    /// The stop has begun: extensions go out from now on (once; later calls do nothing).
    func begin() {
        let (notifier, bound) = (self.notifier, self.bound)
        sender.withLock { sender in
            guard sender == nil else { return }
            sender = Task {
                let end = ContinuousClock.now + bound
                while ContinuousClock.now < end, !Task.isCancelled {
                    notifier.notify("EXTEND_TIMEOUT_USEC=\(Int64(Self.grace / .microseconds(1)))")
                    try? await Task.sleep(for: Self.step)
                }
            }
        }
    }

    /// The stop is done: no more extensions.
    func end() {
        sender.withLock { $0?.cancel() }
    }
}
