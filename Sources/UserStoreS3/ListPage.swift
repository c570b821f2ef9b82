import Foundation

/// The parts of S3's XML replies the client reads: one page of `ListObjectsV2` (asked with
/// `encoding-type=url`, so keys and prefixes arrive percent-encoded), the errors of a
/// `DeleteObjects`, an error reply's code and message.
///
/// S3's replies are flat, fixed documents: the elements read here never nest in themselves, so
/// finding each `<Name>…</Name>` in order is enough (no XML parser: Foundation's needs libxml2,
/// which the static build would have to link).
struct ListPage {
    var keys: [String] = []
    var prefixes: [String] = []
    var nextToken: String?

    init(_ body: Data) {
        let text = String(decoding: body, as: UTF8.self)
        for contents in Self.elements("Contents", in: text[...]) {
            if let key = Self.elements("Key", in: contents).first { keys.append(Self.decodeURL(key)) }
        }
        for common in Self.elements("CommonPrefixes", in: text[...]) {
            if let prefix = Self.elements("Prefix", in: common).first { prefixes.append(Self.decodeURL(prefix)) }
        }
        if Self.elements("IsTruncated", in: text[...]).first == "true" {
            nextToken = Self.elements("NextContinuationToken", in: text[...]).first.map(Self.unescape)
        }
    }

    /// The text of the first `<name>` element in `body`, unescaped.
    static func text(of name: String, in body: Data) -> String? {
        elements(name, in: String(decoding: body, as: UTF8.self)[...]).first.map(unescape)
    }

    /// The `<Error>` entries of a `DeleteObjects` reply.
    static func errors(in body: Data) -> [(key: String, code: String, message: String)] {
        elements("Error", in: String(decoding: body, as: UTF8.self)[...]).map { error in
            (elements("Key", in: error).first.map(unescape) ?? "", elements("Code", in: error).first.map(unescape) ?? "",
             elements("Message", in: error).first.map(unescape) ?? "")
        }
    }

    /// The contents of every `<name>…</name>` (or `<name attr…>…</name>`) in `text`, in order.
    static func elements(_ name: String, in text: Substring) -> [Substring] {
        var found: [Substring] = []
        var rest = text
        while let open = rest.range(of: "<" + name) {
            let afterName = open.upperBound
            guard afterName < rest.endIndex, rest[afterName] == ">" || rest[afterName] == " ",
                  let tagEnd = rest[afterName...].firstIndex(of: ">") else {
                rest = rest[afterName...]
                continue
            }
            let start = rest.index(after: tagEnd)
            guard let close = rest[start...].range(of: "</" + name + ">") else { break }
            found.append(rest[start..<close.lowerBound])
            rest = rest[close.upperBound...]
        }
        return found
    }

    /// A key or prefix as `encoding-type=url` sends it (form encoding: a space is `+`, a plus
    /// `%2B`), decoded.
    static func decodeURL(_ text: Substring) -> String {
        let unescaped = unescape(text).replacingOccurrences(of: "+", with: " ")
        return unescaped.removingPercentEncoding ?? unescaped
    }

    static func unescape(_ text: Substring) -> String {
        guard text.contains("&") else { return String(text) }
        return text.replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
            .replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&apos;", with: "'")
            .replacingOccurrences(of: "&amp;", with: "&")
    }

    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
            .replacingOccurrences(of: "'", with: "&apos;")
    }
}
