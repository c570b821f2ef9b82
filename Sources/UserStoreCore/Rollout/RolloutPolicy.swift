import Foundation

/// How a release reaches the fleet in stages (`rollout:` in the configuration, or
/// `userstorectl release start`): the canary users first, then cohorts of a growing share of
/// users, each step held for `waitSeconds`, halted by itself once more than `haltOn` of the
/// current cohort's stores failed to migrate (docs/releases.md).
public struct RolloutPolicy: Sendable, Equatable, Codable {
    /// The cohorts' sizes in percent of users, ascending, the last one 100.
    public var steps: [Double]
    /// Users in the release from its first step (they migrate before any cohort).
    public var canary: [String]
    /// How long each step lasts before the next begins (`release next` skips the wait).
    public var waitSeconds: Int
    /// The failure ratio (0–1) past which the release halts by itself.
    public var haltOn: Double

    public static let defaultWaitSeconds = 600
    public static let defaultHaltOn = 0.01

    /// A policy, checked: steps ascending in (0, 100] ending at 100, canaries valid user IDs,
    /// `waitSeconds` ≥ 0, `haltOn` in [0, 1].
    public init(steps: [Double], canary: [String] = [], waitSeconds: Int = defaultWaitSeconds,
                haltOn: Double = defaultHaltOn) throws(RolloutPolicyError) {
        guard !steps.isEmpty else { throw .init("steps: at least one step is needed, e.g. 1%,10%,50%,100%") }
        for (index, step) in steps.enumerated() {
            guard step > 0, step <= 100 else { throw .init("steps: \(Self.format(step))% is not between 0% and 100%") }
            if index > 0, step <= steps[index - 1] {
                throw .init("steps: must grow (\(Self.format(steps[index - 1]))% is followed by \(Self.format(step))%)")
            }
        }
        guard steps.last == 100 else { throw .init("steps: the last step must be 100% (got \(Self.format(steps.last!))%)") }
        for user in canary {
            do { _ = try UserID(user) } catch { throw .init("canary: \(error)") }
        }
        guard waitSeconds >= 0 else { throw .init("wait: must not be negative") }
        guard (0...1).contains(haltOn) else { throw .init("haltOn: must be between 0% and 100% (got \(Self.percent(ratio: haltOn)))") }
        self.steps = steps
        self.canary = canary
        self.waitSeconds = waitSeconds
        self.haltOn = haltOn
    }

    /// The stages a release goes through: 0% (canaries only) first when there are canaries,
    /// then the steps.
    public var stages: [Double] { (canary.isEmpty ? [] : [0]) + steps }

    /// `1%,10%,50%,100%` (the `%` is optional).
    public static func parseSteps(_ text: String) throws(RolloutPolicyError) -> [Double] {
        var steps: [Double] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard let step = parsePercent(String(part)) else { throw .init("steps: \"\(part)\" is not a percentage like 10%") }
            steps.append(step)
        }
        return steps
    }

    /// `0.5%` or `0.5` → 0.5; nil when not a finite number.
    public static func parsePercent(_ text: String) -> Double? {
        var digits = text.trimmingCharacters(in: .whitespaces)
        if digits.hasSuffix("%") { digits.removeLast() }
        guard let value = Double(digits), value.isFinite else { return nil }
        return value
    }

    /// `90`, `90s`, `10m`, `2h`, `1d` → seconds; nil when malformed.
    public static func parseDuration(_ text: String) -> Int? {
        let units: [Character: Int] = ["s": 1, "m": 60, "h": 3_600, "d": 86_400]
        var digits = Substring(text.trimmingCharacters(in: .whitespaces))
        var unit = 1
        if let last = digits.last, let seconds = units[last] {
            unit = seconds
            digits = digits.dropLast()
        }
        guard let value = Int(digits), value >= 0, value <= Int(Int32.max) / unit else { return nil }
        return value * unit
    }

    /// `10`, `0.5` (no trailing `.0`).
    public static func format(_ percent: Double) -> String {
        percent == percent.rounded() ? String(Int64(percent)) : String(percent)
    }

    /// A ratio (0–1) as a percentage to two decimals: 0.0625 → `6.25%`, 0.01 → `1%`.
    public static func percent(ratio: Double) -> String {
        format((ratio * 10_000).rounded() / 100) + "%"
    }
}

/// A rollout policy that cannot be used, and why (names the setting).
public struct RolloutPolicyError: Error, CustomStringConvertible, Sendable, Equatable {
    public let description: String
    init(_ description: String) { self.description = description }
}
