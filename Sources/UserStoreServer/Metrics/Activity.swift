import Synchronization
import Varlink
#if canImport(Glibc)
import Glibc
#endif

/// What the daemon did in the last seconds, for `io.userstore.Admin.Top`: one window per second
/// (the last ``windowCount`` kept) with, per method, calls, time spent and a latency histogram,
/// and the busiest users in a bounded Space-Saving sketch (Metwally et al.): memory does not grow
/// with the number of users, and a user with more than 1/``sketchSize`` of a window's calls is
/// always in it.
final class Activity: Sendable {
    static let windowCount = 10
    static let sketchSize = 64

    /// Calls of one method in one window.
    struct MethodStats {
        var calls = 0
        var nanoseconds: UInt64 = 0
        /// Calls by latency: bucket `b` holds those under 2^b µs.
        var latency = [Int](repeating: 0, count: 32)

        mutating func add(nanoseconds: UInt64, bucket: Int) {
            calls += 1
            self.nanoseconds += nanoseconds
            latency[bucket] += 1
        }
    }

    /// One user in a window's sketch: its calls (over-counted by at most `error`), time, bytes.
    struct UserStats {
        var user: String
        var calls: Int
        var error: Int
        var nanoseconds: UInt64
        var bytes: Int
    }

    struct Window {
        var second: UInt64 = 0
        /// A handful of methods, found by a scan: the caller passes the same string each time,
        /// which compares by identity before any byte (hashing it cost more).
        var methods: [(method: String, stats: MethodStats)] = []
        var users: [UserStats] = []
        /// Where each user of `users` is.
        var positions: [String: Int] = [:]

        /// Counts one call; Space-Saving when the sketch is full.
        mutating func record(method: String, user: String?, nanoseconds: UInt64, bytes: Int, bucket: Int) {
            if let index = methods.firstIndex(where: { $0.method == method }) {
                methods[index].stats.add(nanoseconds: nanoseconds, bucket: bucket)
            } else {
                methods.append((method, MethodStats()))
                methods[methods.count - 1].stats.add(nanoseconds: nanoseconds, bucket: bucket)
            }
            guard let user else { return }
            if let index = positions[user] {
                users[index].calls += 1
                users[index].nanoseconds += nanoseconds
                users[index].bytes += bytes
            } else if users.count < Activity.sketchSize {
                positions[user] = users.count
                users.append(UserStats(user: user, calls: 1, error: 0, nanoseconds: nanoseconds, bytes: bytes))
            } else {
                // Space-Saving: the least counted entry gives way and its count carries over.
                let least = users.indices.min { users[$0].calls < users[$1].calls }!
                let carried = users[least].calls
                positions[users[least].user] = nil
                positions[user] = least
                users[least] = UserStats(user: user, calls: carried + 1, error: carried, nanoseconds: nanoseconds, bytes: bytes)
            }
        }
    }

    /// The windows, once per recording thread (``ThreadShards``): a sketch per loop, merged
    /// when read. A user with more than 1/``sketchSize`` of a window's calls has that share on
    /// at least one loop, so it is still always in the merged report.
    private let windows = ThreadShards { [Window](repeating: Window(), count: Activity.windowCount) }

    /// Records one call of `method` for `user` that took `nanoseconds` and replied `bytes`.
    func record(method: String, user: String?, nanoseconds: UInt64, bytes: Int) {
        let second = Self.currentSecond()
        let bucket = min(31, 64 - (nanoseconds / 1000).leadingZeroBitCount)
        windows.record { windows in
            let slot = Int(second % UInt64(Self.windowCount))
            if windows[slot].second != second { windows[slot] = Window(second: second) }
            windows[slot].record(method: method, user: user, nanoseconds: nanoseconds, bytes: bytes, bucket: bucket)
        }
    }

    /// The last `seconds` complete seconds (1…``windowCount`` - 1): calls per method with rates
    /// and latency percentiles, and the `limit` busiest users.
    func report(seconds: Int, limit: Int) -> [String: JSONValue] {
        let now = Self.currentSecond()
        let seconds = max(1, min(seconds, Self.windowCount - 1))
        let recent = windows.all.joined().filter { $0.second < now && $0.second >= now - UInt64(seconds) }
        var methods: [String: MethodStats] = [:]
        var users: [String: UserStats] = [:]
        for window in recent {
            for (method, stats) in window.methods {
                var total = methods[method, default: MethodStats()]
                total.calls += stats.calls
                total.nanoseconds += stats.nanoseconds
                for bucket in 0..<32 { total.latency[bucket] += stats.latency[bucket] }
                methods[method] = total
            }
            for entry in window.users {
                var total = users[entry.user, default: UserStats(user: entry.user, calls: 0, error: 0, nanoseconds: 0, bytes: 0)]
                total.calls += entry.calls
                total.error += entry.error
                total.nanoseconds += entry.nanoseconds
                total.bytes += entry.bytes
                users[entry.user] = total
            }
        }
        let duration = Double(seconds)
        let methodRows: [JSONValue] = methods.sorted { $0.value.calls > $1.value.calls }.map { method, stats in
            ["method": .string(method), "calls": .integer(Int64(stats.calls)), "perSecond": .real(Double(stats.calls) / duration),
             "secondsSpent": .real(Double(stats.nanoseconds) / 1e9),
             "p50Milliseconds": .real(Self.percentile(stats.latency, 0.5)), "p99Milliseconds": .real(Self.percentile(stats.latency, 0.99))]
        }
        let userRows: [JSONValue] = users.values.sorted { ($0.calls, $1.user) > ($1.calls, $0.user) }.prefix(max(0, limit)).map { stats in
            ["user": .string(stats.user), "calls": .integer(Int64(stats.calls)), "perSecond": .real(Double(stats.calls) / duration),
             "secondsSpent": .real(Double(stats.nanoseconds) / 1e9), "bytes": .integer(Int64(stats.bytes)),
             "overcount": .integer(Int64(stats.error))]
        }
        let total = methods.values.reduce(0) { $0 + $1.calls }
        return ["seconds": .integer(Int64(seconds)), "calls": .integer(Int64(total)), "perSecond": .real(Double(total) / duration),
                "methods": .array(methodRows), "users": .array(userRows)]
    }

    /// The monotonic clock's second, from its coarse reading: a window needs only the second,
    /// and the coarse clock (one tick behind at most) costs a memory read where the precise one
    /// reads the TSC — on every call recorded.
    private static func currentSecond() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC_COARSE, &spec)
        return UInt64(spec.tv_sec)
    }

    /// The upper bound (ms) of the bucket holding quantile `q` of `latency`.
    static func percentile(_ latency: [Int], _ q: Double) -> Double {
        let total = latency.reduce(0, +)
        guard total > 0 else { return 0 }
        let rank = Int((Double(total) * q).rounded(.up))
        var seen = 0
        for (bucket, count) in latency.enumerated() {
            seen += count
            if seen >= rank { return Double(UInt64(1) << bucket) / 1000 }
        }
        return Double(UInt64(1) << 31) / 1000
    }
}
