import Foundation

/// Where a log object stands in the log: the writer lease's epoch it was written under, the
/// writing process's incarnation, its sequence among that process's objects. Objects are folded,
/// and their records read back, in this order (docs/design.md, "The host log").
package struct LogObjectPosition: Comparable, Hashable, Sendable {
    package var epoch: Int64
    package var incarnation: String
    package var sequence: UInt64

    package init(epoch: Int64, incarnation: String, sequence: UInt64) {
        self.epoch = epoch
        self.incarnation = incarnation
        self.sequence = sequence
    }

    /// The position of the object with `header`.
    package init(_ header: LogSegment.Header) {
        self.init(epoch: header.epoch, incarnation: header.incarnation, sequence: header.sequence)
    }

    /// The position of `record` in the object with `header`: in a cluster's object, at its
    /// bucket's epoch (objects of a cluster are written under 0).
    package init(_ header: LogSegment.Header, _ record: LogRecord) {
        self.init(epoch: header.cluster == true ? record.epoch : header.epoch, incarnation: header.incarnation, sequence: header.sequence)
    }

    package static func < (a: Self, b: Self) -> Bool {
        (a.epoch, a.incarnation, a.sequence) < (b.epoch, b.incarnation, b.sequence)
    }

    /// `<epoch: 20 digits>-<incarnation>-<sequence: 16 hex digits>`, which sorts as positions do
    /// (a folded object's name: the last log object it holds).
    package var name: String {
        let epoch = String(max(epoch, 0))
        let sequence = String(sequence, radix: 16)
        return String(repeating: "0", count: max(0, 20 - epoch.count)) + epoch + "-" + incarnation + "-"
            + String(repeating: "0", count: max(0, 16 - sequence.count)) + sequence
    }

    /// The position `name` spells (see ``name``); nil when it is not one.
    package init?(name: Substring) {
        let parts = name.split(separator: "-")
        guard parts.count == 3, let epoch = Int64(parts[0]), let sequence = UInt64(parts[2], radix: 16) else { return nil }
        self.init(epoch: epoch, incarnation: String(parts[1]), sequence: sequence)
    }
}
