/// Why bytes are not acceptable JSON.
public struct JSONParseError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What is wrong.
    public let reason: String
    /// Byte offset where it was noticed.
    public let offset: Int

    public var description: String { "invalid JSON at byte \(offset): \(reason)" }
}

/// A strict RFC 8259 parser with limits, for untrusted input.
///
/// Written here rather than taken from Foundation because the protocol needs two things
/// Foundation's JSON does not keep: exact 64-bit integers and the difference between `2` and
/// `2.0`. It reads a ``JSONTape`` (the one strict scanner, with its nesting limit) into
/// ``JSONValue``s.
public struct JSONParser {
    /// Deepest nesting accepted.
    public var maxDepth: Int

    public init(maxDepth: Int = 64) {
        self.maxDepth = maxDepth
    }

    /// Parses exactly one JSON value (surrounded by optional whitespace) from `bytes`.
    public func parse<Bytes: Collection<UInt8>>(_ bytes: Bytes) throws(JSONParseError) -> JSONValue {
        let result: Result<JSONValue, JSONParseError>? = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(JSONParseError) -> JSONValue in try parse(buffer: buffer) }
        }
        if let result { return try result.get() }
        return try Array(bytes).withUnsafeBufferPointer { buffer throws(JSONParseError) in try parse(buffer: buffer) }
    }

    /// Parses the UTF-8 of `text`.
    public func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(Array(text.utf8))
    }

    private func parse(buffer: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSONValue {
        var tape = JSONTape(maxDepth: maxDepth)
        try tape.parse(buffer)
        return tape.withView(buffer) { $0.value(0) }
    }
}
