import Crypto

/// Which users a step of a rollout reaches: every user has a fixed place in [0, 10,000) — the
/// first 8 bytes of SHA-256 of their ID, big-endian, modulo 10,000 — so the same user is in the
/// same cohort on every host, in every run and in every release, and a step of p% reaches the
/// users placed below p × 100 (plus the named canaries).
public enum Cohort {
    /// `user`'s place, 0..<10,000.
    public static func position(of user: UserID) -> Int {
        var value: UInt64 = 0
        for byte in SHA256.hash(data: Array(user.rawValue.utf8)).prefix(8) { value = value << 8 | UInt64(byte) }
        return Int(value % 10_000)
    }

    /// Whether a step of `percent` reaches `user`.
    public static func contains(_ user: UserID, percent: Double, canary: [String]) -> Bool {
        Double(position(of: user)) < percent * 100 || canary.contains(user.rawValue)
    }
}
