import Crypto
import Foundation

/// AWS Signature Version 4 in the `Authorization` header, for S3 requests
/// (docs.aws.amazon.com, "Signature Version 4 signing process"): a canonical request, a string
/// to sign over its hash, and an HMAC-SHA256 chain from the secret key over date, region,
/// service and `aws4_request`.
struct SigV4: Sendable {
    let credentials: S3Credentials
    let region: String
    let service = "s3"

    /// The SHA-256 of an empty payload (a GET, a HEAD, a DELETE).
    static let emptyPayloadHash = hex(SHA256.hash(data: Data()))

    /// The headers to add to a request to sign it: `x-amz-date`, `x-amz-content-sha256`,
    /// `authorization` (and `x-amz-security-token` with temporary credentials). `path` is the request's path
    /// exactly as sent (already percent-encoded); `headers` are the other headers to sign
    /// (`host` among them).
    func headers(method: String, path: String, query: [(String, String)], headers: [(String, String)],
                 payloadHash: String, date: Date) -> [(String, String)] {
        let (amzDate, day) = Self.timestamps(date)
        var signed = headers.map { ($0.0.lowercased(), $0.1.trimmingCharacters(in: .whitespaces)) }
        signed.append(("x-amz-date", amzDate))
        signed.append(("x-amz-content-sha256", payloadHash))
        if let token = credentials.sessionToken { signed.append(("x-amz-security-token", token)) }
        signed.sort { $0.0 < $1.0 }
        let signedNames = signed.map(\.0).joined(separator: ";")
        let canonical = [
            method,
            path,
            Self.canonicalQuery(query),
            signed.map { "\($0.0):\($0.1)\n" }.joined(),
            signedNames,
            payloadHash,
        ].joined(separator: "\n")
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let toSign = "AWS4-HMAC-SHA256\n\(amzDate)\n\(scope)\n" + Self.hex(SHA256.hash(data: Data(canonical.utf8)))
        var key = SymmetricKey(data: Data(("AWS4" + credentials.secretAccessKey).utf8))
        for part in [day, region, service, "aws4_request"] {
            key = SymmetricKey(data: Data(HMAC<SHA256>.authenticationCode(for: Data(part.utf8), using: key)))
        }
        let signature = Self.hex(HMAC<SHA256>.authenticationCode(for: Data(toSign.utf8), using: key))
        let given = Set(headers.map { $0.0.lowercased() })
        var result = signed.filter { !given.contains($0.0) }
        result.append(("authorization", "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), SignedHeaders=\(signedNames), Signature=\(signature)"))
        return result
    }

    /// The query string in canonical form: each name and value percent-encoded, sorted by name,
    /// then by value. The request must send exactly this string.
    static func canonicalQuery(_ query: [(String, String)]) -> String {
        let encoded: [(name: String, value: String)] = query.map { (encode($0.0), encode($0.1)) }
        let sorted = encoded.sorted { left, right in left.name == right.name ? left.value < right.value : left.name < right.name }
        return sorted.map { pair in pair.name + "=" + pair.value }.joined(separator: "&")
    }

    /// RFC 3986 percent-encoding: everything but `A–Z a–z 0–9 - _ . ~` (and `/` when `slash`
    /// is kept, for an object key in a path).
    static func encode(_ text: String, keepingSlash slash: Bool = false) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: "/") where slash:
                out.append("/")
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }

    /// Lower-case hex (every request signs three digests: `String(format:)` per byte was a
    /// twentieth of the daemon's CPU under durable writes).
    static func hex<D: Sequence>(_ digest: D) -> String where D.Element == UInt8 {
        let digits = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64)
        for byte in digest {
            bytes.append(digits[Int(byte >> 4)])
            bytes.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// `yyyyMMddTHHmmssZ` and `yyyyMMdd`, in UTC.
    static func timestamps(_ date: Date) -> (String, String) {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let day = "\(parts.tm_year + 1900)" + two(parts.tm_mon + 1) + two(parts.tm_mday)
        return (day + "T" + two(parts.tm_hour) + two(parts.tm_min) + two(parts.tm_sec) + "Z", day)
    }
}
