import Varlink
/// What the fuzzers check on the varlink layer (`Fuzz/`, scripts/fuzz.sh); the tests replay
/// the seed corpora through the same functions. Each traps on a broken invariant.
package enum VarlinkFuzzing {
    /// JSON: hostile bytes never crash the scanner; what it accepts writes back out as JSON
    /// that parses to the same value, and every token reads back in place.
    package static func json(_ data: UnsafeBufferPointer<UInt8>) {
        var tape = JSONTape(maxDepth: 64)
        guard (try? tape.parse(data)) != nil else { return }
        let value = tape.withView(data) { view -> JSONValue in
            for index in view.tokens.indices {
                switch view.kind(index) {
                case .string: _ = view.string(index)
                case .number: _ = (view.integer(index), view.double(index))
                case .object: _ = view.member("method", of: index)
                default: break
                }
            }
            return view.value(0)
        }
        var writer = JSONWriter()
        writer.write(value)
        guard let again = try? JSONParser(maxDepth: 64).parse(writer.bytes) else { fatalError("written JSON does not parse: \(value)") }
        precondition(again == value || !again.isExactlyComparable, "JSON round trip changed \(value) into \(again)")
    }

    /// NUL framing: the input arriving in pieces of sizes drawn from its first byte gives the
    /// same messages as splitting it whole, and a message over the limit is reported as such.
    package static func framing(_ data: UnsafeBufferPointer<UInt8>) {
        guard let seed = data.first else { return }
        let input = Array(data.dropFirst())
        let limit = 64
        var expected: [[UInt8]] = []
        var overflow = false
        var current: [UInt8] = []
        for byte in input where !overflow {
            if byte == 0 {
                if current.count > limit { overflow = true } else { expected.append(current) }
                current = []
            } else {
                current.append(byte)
                if current.count > limit { overflow = true }
            }
        }
        var framer = MessageFramer(maxMessageBytes: limit)
        var buffer: [UInt8] = []
        var got: [[UInt8]] = []
        var sawOverflow = false
        var offset = 0, step = Int(seed % 17) + 1
        while offset < input.count && !sawOverflow {
            let end = min(input.count, offset + step)
            buffer += input[offset..<end]
            offset = end
            step = step * 5 % 17 + 1
            while !sawOverflow {
                let next = buffer.withUnsafeBytes { framer.next(in: $0) }
                if case .message(let length) = next {
                    got.append(Array(buffer[..<length]))
                    buffer.removeFirst(length + 1)
                } else if case .tooLarge = next {
                    sawOverflow = true
                } else {
                    break
                }
            }
        }
        precondition(got == expected, "framing differs: \(got.count) messages, expected \(expected.count)")
        precondition(sawOverflow == overflow, "overflow \(sawOverflow), expected \(overflow)")
    }
}

extension JSONValue {
    /// False for values whose text form is not one-to-one (NaN never is; huge integers become reals).
    var isExactlyComparable: Bool {
        switch self {
        case .real(let real): return !real.isNaN
        case .array(let elements): return elements.allSatisfy(\.isExactlyComparable)
        case .object(let members): return members.values.allSatisfy(\.isExactlyComparable)
        default: return true
        }
    }
}
