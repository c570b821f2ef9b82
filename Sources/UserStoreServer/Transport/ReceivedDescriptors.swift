#if canImport(Glibc)
import Glibc
#endif

/// File descriptors a connection received (`SCM_RIGHTS`) and has not handed over yet, each
/// with the stream offset of the last byte of the read it came with: a message owns those
/// that arrived within its bytes.
struct ReceivedDescriptors {
    private var list: [(offset: Int, descriptor: Int32)] = []

    /// Descriptors that came with a read whose last byte is at stream offset `offset`.
    mutating func received(_ descriptors: some Sequence<Int32>, endingAt offset: Int) {
        for descriptor in descriptors { list.append((offset, descriptor)) }
    }

    /// The descriptors that came with the bytes up to stream offset `end`, taken.
    mutating func take(upTo end: Int) -> [Int32] {
        guard let first = list.first, first.offset <= end else { return [] }
        let count = list.prefix { $0.offset <= end }.count
        defer { list.removeFirst(count) }
        return list.prefix(count).map(\.descriptor)
    }

    /// Gives back descriptors taken for a message that waits (handled again later).
    mutating func putBack(_ descriptors: [Int32], at offset: Int) {
        list.insert(contentsOf: descriptors.map { (offset, $0) }, at: 0)
    }

    /// Closes them all (the connection closed).
    mutating func closeAll() {
        for (_, descriptor) in list { close(descriptor) }
        list.removeAll()
    }
}
