/// An application user ID, validated: the name of exactly one store.
///
/// An ID is 1–128 bytes of `A–Z a–z 0–9 . _ - @ +` and does not start with `.` or `-`.
/// Anything else is refused with ``UserIDError``; an ID is never rewritten, truncated or mapped,
/// so no ID can name a path outside the data directory (no `/`, no NUL, no `..`).
public struct UserID: Hashable, Sendable, CustomStringConvertible, Comparable {
    /// The ID exactly as the application sent it.
    public let rawValue: String

    /// The longest accepted ID, in bytes.
    public static let maxLength = 128

    /// Validates `rawValue`; throws ``UserIDError`` naming the first problem.
    public init(_ rawValue: String) throws(UserIDError) {
        // Read in place where the string's bytes are contiguous (native strings: every request's).
        let problem = rawValue.utf8.withContiguousStorageIfAvailable(Self.problem(in:))
            ?? Array(rawValue.utf8).withUnsafeBufferPointer(Self.problem(in:))
        if let problem { throw problem }
        self.rawValue = rawValue
    }

    /// The first problem of `bytes` as a user ID, if any.
    private static func problem(in bytes: UnsafeBufferPointer<UInt8>) -> UserIDError? {
        guard let first = bytes.first else { return .empty }
        guard bytes.count <= maxLength else { return .tooLong(bytes.count) }
        if first == UInt8(ascii: ".") || first == UInt8(ascii: "-") {
            return .badFirstCharacter(Character(UnicodeScalar(first)))
        }
        for offset in bytes.indices where !isAllowed(bytes[offset]) {
            return .forbiddenByte(bytes[offset], offset: offset)
        }
        return nil
    }

    /// Whether `byte` may appear in a user ID.
    @inline(__always)
    static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"), UInt8(ascii: "@"), UInt8(ascii: "+"):
            return true
        default:
            return false
        }
    }

    public var description: String { rawValue }

    public static func < (lhs: UserID, rhs: UserID) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// Why a string is not a valid ``UserID``.
public enum UserIDError: Error, Equatable, Sendable, CustomStringConvertible {
    case empty
    case tooLong(Int)
    case badFirstCharacter(Character)
    case forbiddenByte(UInt8, offset: Int)

    public var description: String {
        switch self {
        case .empty:
            return "user ID is empty"
        case .tooLong(let count):
            return "user ID is \(count) bytes long; at most \(UserID.maxLength) are allowed"
        case .badFirstCharacter(let character):
            return "user ID must not start with '\(character)'"
        case .forbiddenByte(let byte, let offset):
            let shown = (0x21...0x7E).contains(byte) ? "'\(Character(UnicodeScalar(byte)))'" : "byte 0x\(String(byte, radix: 16, uppercase: true))"
            return "user ID contains \(shown) at offset \(offset); allowed are A-Z a-z 0-9 . _ - @ +"
        }
    }
}
