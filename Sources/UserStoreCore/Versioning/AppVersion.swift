/// An application version with real version ordering: `1.10 > 1.9`, `1.2 == 1.2.0`,
/// `2.0-beta.1 < 2.0`.
///
/// Syntax: dot-separated parts (`1.10.3`, `2026.11.2`, any number of parts), then optionally
/// `-prerelease` and `+build`. Parts that are all digits compare as numbers, other parts as text,
/// and a numeric part sorts before a text part. Missing parts count as `0`. A version with a
/// pre-release sorts before the same version without one. Build metadata is kept but ignored
/// when comparing, as in SemVer.
public struct AppVersion: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The text it was parsed from.
    public let text: String
    private let release: [Part]
    private let prerelease: [Part]?

    private enum Part: Hashable, Comparable {
        case number(UInt64)
        case word(String)
    }

    /// Parses `text`; throws ``AppVersionError`` when it is not a version.
    public init(_ text: String) throws(AppVersionError) {
        guard !text.isEmpty, text.utf8.count <= 64 else { throw .malformed(text) }
        let withoutBuild = text.split(separator: "+", maxSplits: 1, omittingEmptySubsequences: false)[0]
        let pieces = withoutBuild.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard let release = Self.parts(pieces[0]) else { throw .malformed(text) }
        var prerelease: [Part]?
        if pieces.count == 2 {
            guard let parsed = Self.parts(pieces[1]) else { throw .malformed(text) }
            prerelease = parsed
        }
        for byte in text.utf8 where !Self.isAllowed(byte) { throw .malformed(text) }
        self.text = text
        self.release = release
        self.prerelease = prerelease
    }

    private static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"),
             UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "."), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "_"):
            return true
        default:
            return false
        }
    }

    private static func parts(_ text: Substring) -> [Part]? {
        let pieces = text.split(separator: ".", omittingEmptySubsequences: false)
        var result: [Part] = []
        for piece in pieces {
            guard !piece.isEmpty else { return nil }
            if piece.allSatisfy(\.isASCII), piece.allSatisfy(\.isNumber), let number = UInt64(piece) {
                result.append(.number(number))
            } else {
                result.append(.word(String(piece)))
            }
        }
        return result
    }

    public var description: String { text }

    public static func == (lhs: AppVersion, rhs: AppVersion) -> Bool { compare(lhs, rhs) == 0 }
    public static func < (lhs: AppVersion, rhs: AppVersion) -> Bool { compare(lhs, rhs) < 0 }
    public func hash(into hasher: inout Hasher) {
        var trimmed = release
        while trimmed.last == .number(0) { trimmed.removeLast() }
        hasher.combine(trimmed)
        hasher.combine(prerelease)
    }

    private static func compare(_ lhs: AppVersion, _ rhs: AppVersion) -> Int {
        let releaseOrder = compareParts(lhs.release, rhs.release, padWithZero: true)
        if releaseOrder != 0 { return releaseOrder }
        switch (lhs.prerelease, rhs.prerelease) {
        case (nil, nil): return 0
        case (nil, _): return 1
        case (_, nil): return -1
        case (let left?, let right?): return compareParts(left, right, padWithZero: false)
        }
    }

    private static func compareParts(_ lhs: [Part], _ rhs: [Part], padWithZero: Bool) -> Int {
        for index in 0..<max(lhs.count, rhs.count) {
            let left = index < lhs.count ? lhs[index] : (padWithZero ? .number(0) : nil)
            let right = index < rhs.count ? rhs[index] : (padWithZero ? .number(0) : nil)
            guard let left else { return -1 }
            guard let right else { return 1 }
            if left < right { return -1 }
            if right < left { return 1 }
        }
        return 0
    }
}

/// Why a string is not an ``AppVersion``.
public enum AppVersionError: Error, Equatable, Sendable, CustomStringConvertible {
    case malformed(String)

    public var description: String {
        switch self {
        case .malformed(let text):
            return "'\(text)' is not a version (expected dot-separated parts such as 1.10.2, optionally -prerelease and +build)"
        }
    }
}
