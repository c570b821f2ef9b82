import Foundation
import VarlinkJSON

/// One committed transaction of a store, as its watchers see it: the rows it changed, or a
/// reset (changed by a migration, an import, a restore or a rollback: the app re-reads).
public struct ChangeEvent: Sendable, Equatable {
    public enum Operation: String, Sendable {
        case insert, update, delete
    }

    /// One changed row.
    public struct Change: Sendable, Equatable {
        public var table: String
        public var operation: Operation
        public var rowid: Int64
        /// The new row as a JSON object (the exact value encoding of `io.userstore.Store`);
        /// nil for a delete.
        public var values: [UInt8]?
    }

    /// The store's position after this transaction.
    public var position: Int64
    /// Unix milliseconds.
    public var committedAt: Int64
    public var reset: Bool
    public var changes: [Change]

    /// Whether a watcher of `tables` (nil: all) sees this event. A reset concerns everyone.
    public func concerns(_ tables: Set<String>?) -> Bool {
        guard let tables, !reset else { return true }
        return changes.contains { tables.contains($0.table.lowercased()) }
    }

    /// The reply's parameters: `{"position": P, "committedAt": "…", "changes": […]}` (only the
    /// changes to `tables`, with their values if `values`), or `{"position": P, "reset": true}`.
    public func encode(into writer: inout JSONWriter, tables: Set<String>?, values: Bool) {
        writer.raw("{\"position\":")
        writer.write(position)
        if reset {
            writer.raw(",\"reset\":true}")
            return
        }
        writer.raw(",\"committedAt\":")
        writer.write(Self.timestamp(committedAt))
        writer.raw(",\"changes\":[")
        var first = true
        for change in changes where tables?.contains(change.table.lowercased()) ?? true {
            if !first { writer.raw(byte: UInt8(ascii: ",")) }
            first = false
            writer.raw("{\"table\":")
            writer.write(change.table)
            writer.raw(",\"operation\":")
            writer.write(change.operation.rawValue)
            writer.raw(",\"rowid\":")
            writer.write(change.rowid)
            if values, let row = change.values {
                writer.raw(",\"values\":")
                writer.bytes.append(contentsOf: row)
            }
            writer.raw(byte: UInt8(ascii: "}"))
        }
        writer.raw("]}")
    }

    /// RFC 3339 with milliseconds, UTC.
    static func timestamp(_ milliseconds: Int64) -> String {
        var seconds = time_t(milliseconds / 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                      Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), Int(milliseconds % 1000))
    }
}
