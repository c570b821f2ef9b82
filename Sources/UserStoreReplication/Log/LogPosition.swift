import Foundation
import UserStoreCore

/// Where a store's log stream stands, kept beside the store (`.<user>.sqlite-log`) and written
/// only when it is true in the replica: after the store's base is stored, and after each of the
/// daemon's checkpoints once every record of the store was stored. It says that the database
/// file, plus the WAL's frames up to `frames` under `salt` (none when `salt` is nil: the WAL is
/// empty), is the state at `txid` of `stream`, replicated under `epoch`; each commit frame of the
/// WAL after that adds one to the txid.
///
/// A store whose WAL or database file does not match it — changed where capture could not see
/// it (offline, restored, imported; another process that checkpointed its writes into the file
/// and left no WAL), a crash between a checkpoint and this file's update, or replicated under
/// another epoch before — ships a new base (docs/design.md, "The host log").
package struct LogPosition: Codable, Sendable, Equatable {
    package var stream: UInt64
    package var epoch: Int64
    package var txid: UInt64
    package var salt: WALCapture.Salt?
    package var frames: UInt32
    /// The database file as it was when this was saved (nil in a position saved before the
    /// stamp existed: then only the WAL is compared).
    package var file: FileStamp?
    /// A base of `stream` is on its way under `epoch`, not known to be stored: the store ships a
    /// base again at its next open (nothing to continue), but the epoch its file was last
    /// written under is known — what ``LogReplicator/newerCopy(of:path:)`` compares with the
    /// epoch held. Written durably before the base leaves, so that no crash leaves a store
    /// whose base may be in the bucket without its epoch beside it.
    package var pending = false

    /// What identifies a version of the database file without reading it: only a checkpoint
    /// writes the file of a store in WAL mode, and the daemon saves a new position after each
    /// of its own, so a file that differs was written by someone else (or the daemon crashed
    /// between its checkpoint and the save).
    package struct FileStamp: Codable, Sendable, Equatable {
        var size: Int64
        var modifiedSeconds: Int64
        var modifiedNanoseconds: Int64
        var inode: UInt64

        /// The stamp of the file at `path` now (nil when it cannot be read).
        package init?(of path: String) {
            var status = stat()
            guard stat(path, &status) == 0 else { return nil }
            size = Int64(status.st_size)
            modifiedSeconds = Int64(status.st_mtim.tv_sec)
            modifiedNanoseconds = Int64(status.st_mtim.tv_nsec)
            inode = UInt64(status.st_ino)
        }
    }

    /// Whether the database file at `storePath` is the one this position was saved with (true
    /// for a position without a stamp).
    package func matchesFile(_ storePath: String) -> Bool {
        file.map { $0 == FileStamp(of: storePath) } ?? true
    }

    /// The file beside the store at `storePath`.
    package static func path(of storePath: String) -> String {
        let url = URL(fileURLWithPath: storePath)
        return url.deletingLastPathComponent().path + "/." + url.lastPathComponent + "-log"
    }

    /// The position kept beside the store at `storePath`; nil when there is none (or it is not
    /// what userstored wrote: then the store ships a base).
    package static func load(_ storePath: String) -> LogPosition? {
        FileManager.default.contents(atPath: path(of: storePath)).flatMap { try? JSONDecoder().decode(Self.self, from: $0) }
    }

    /// Writes it beside the store at `storePath`, durably, with the database file's stamp now.
    package func save(beside storePath: String) throws {
        var stamped = self
        stamped.file = FileStamp(of: storePath)
        try DurableFile.write(String(decoding: (try? JSONEncoder().encode(stamped)) ?? Data(), as: UTF8.self), to: Self.path(of: storePath))
    }

    /// Removes the position beside `storePath` (the file was replaced: its next open ships a base).
    package static func forget(_ storePath: String) {
        unlink(path(of: storePath))
    }

    /// Saves, durably, that a base of `stream` is about to go out under `epoch` (``pending``):
    /// done before a new base goes out, so that a crash before the base's position is saved
    /// never leaves the old stream's position to be continued after the base (a restore follows
    /// the newest base: commits of the old stream after it would be lost — found by
    /// `make crash-s3`), nor a store without the epoch it was written under (in a cluster, a
    /// copy another host wrote since would not be told from it).
    package static func shipping(stream: UInt64, epoch: Int64, beside storePath: String) throws {
        try LogPosition(stream: stream, epoch: epoch, txid: 0, salt: nil, frames: 0, pending: true).save(beside: storePath)
    }
}

extension LogPosition {
    private enum CodingKeys: String, CodingKey { case stream, epoch, txid, salt, frames, file, pending }

    /// A pending position is written without `txid` and `frames`: a daemon from before pending
    /// positions cannot read it (it needs both), so it ships a base — never continues a stream
    /// whose base may not be stored.
    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        stream = try container.decode(UInt64.self, forKey: .stream)
        epoch = try container.decode(Int64.self, forKey: .epoch)
        pending = try container.decodeIfPresent(Bool.self, forKey: .pending) ?? false
        txid = pending ? 0 : try container.decode(UInt64.self, forKey: .txid)
        frames = pending ? 0 : try container.decode(UInt32.self, forKey: .frames)
        salt = try container.decodeIfPresent(WALCapture.Salt.self, forKey: .salt)
        file = try container.decodeIfPresent(FileStamp.self, forKey: .file)
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(stream, forKey: .stream)
        try container.encode(epoch, forKey: .epoch)
        if pending {
            try container.encode(true, forKey: .pending)
        } else {
            try container.encode(txid, forKey: .txid)
            try container.encode(frames, forKey: .frames)
            try container.encodeIfPresent(salt, forKey: .salt)
            try container.encodeIfPresent(file, forKey: .file)
        }
    }
}

extension WALCapture.Salt: Codable {
    public init(from decoder: any Decoder) throws {
        var container = try decoder.unkeyedContainer()
        self.init(first: try container.decode(UInt32.self), second: try container.decode(UInt32.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.unkeyedContainer()
        try container.encode(first)
        try container.encode(second)
    }
}
