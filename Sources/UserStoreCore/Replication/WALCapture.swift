import Foundation

/// Reads each commit's pages out of a store's write-ahead log, at the moment SQLite's WAL hook
/// reports the commit: what the daemon's own replication ships (docs/design.md, "The host log").
///
/// The daemon is the only writer of its stores (the data directory's lock, one connection per
/// store), so the frames between the WAL's frame count at the previous commit and at this one
/// are exactly this commit's — its pages, including those a large transaction spilled before it
/// committed (a rolled-back transaction's spilled frames lie past the count and are overwritten
/// by the next). A WAL that restarted (a checkpoint emptied it, and the next commit began again
/// at frame 1 under a new salt) is told by its header's salt. Each page is taken once, at its
/// last image in the commit.
///
/// Not thread-safe: used only from the store's connection (the hook runs on it, after the commit,
/// before anything else runs on the store).
public final class WALCapture: @unchecked Sendable {
    /// One committed transaction.
    public struct Commit: Sendable, Equatable {
        /// The database's page size.
        public var pageSize: Int
        /// The database's size in pages after the commit.
        public var databasePages: UInt32
        /// Every page the commit wrote, once each (its last image), by ascending page number.
        public var pages: [Page]
        /// Where the commit ends in the WAL: its salt and the commit frame's number.
        public var salt: Salt
        public var frame: UInt32
        /// How many commits it holds: 1 for each commit the hook reports; more for what a WAL held
        /// (``contentsAsOneCommit()``).
        public var commits: Int
    }

    /// A page and its number (1-based).
    public struct Page: Sendable, Equatable {
        public var number: UInt32
        public var data: [UInt8]

        public init(number: UInt32, data: [UInt8]) {
            self.number = number
            self.data = data
        }
    }

    /// A WAL header's salt: it changes each time the WAL restarts.
    public struct Salt: Sendable, Hashable {
        public var first: UInt32
        public var second: UInt32

        public init(first: UInt32, second: UInt32) {
            self.first = first
            self.second = second
        }
    }

    /// Why a commit could not be read (the WAL is not what SQLite's format says, or the file
    /// could not be read): the commit is in the store, but replication must ship the store
    /// whole to be sure of it.
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public let description: String
    }

    /// The WAL file (`<store>-wal`).
    public let walPath: String
    private var descriptor: Int32 = -1
    /// The salt and the frame count as of the last commit read.
    private var salt: Salt?
    private var frames: UInt32 = 0
    /// Gets each commit (or why it could not be read), on the store's connection; set before the
    /// capture is handed to the store's ``WALHook``.
    public var deliver: (Result<Commit, Failure>) -> Void

    /// Capture of the store at `databasePath`.
    public init(databasePath: String, deliver: @escaping (Result<Commit, Failure>) -> Void = { _ in }) {
        walPath = databasePath + "-wal"
        self.deliver = deliver
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    /// Starts capture after what the WAL holds now (frames before are not delivered): its
    /// frames of the header's salt up to the last commit frame among them — a file that restarted
    /// keeps older frames past them under another salt, and a rolled-back transaction's spilled
    /// frames past the last commit frame. Returns that position.
    @discardableResult
    public func resumeAfterCurrentContents() throws(Failure) -> (salt: Salt?, frames: UInt32) {
        guard let header = try readHeader() else {
            salt = nil
            frames = 0
            return (nil, 0)
        }
        let frameSize = 24 + header.pageSize
        var head = [UInt8](repeating: 0, count: 24)
        var frame: UInt32 = 0, lastCommit: UInt32 = 0
        while true {
            let offset = 32 + Int64(frame) * Int64(frameSize)
            let read = head.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, 24, off_t(offset)) }
            guard read == 24, Salt(first: Self.bigEndian(head, 8), second: Self.bigEndian(head, 12)) == header.salt else { break }
            frame += 1
            if Self.bigEndian(head, 4) > 0 { lastCommit = frame }
        }
        salt = header.salt
        frames = lastCommit
        return (salt, frames)
    }

    /// Where capture stands: the salt and the frame count as of the last commit read.
    public var position: (salt: Salt?, frames: UInt32) { (salt, frames) }

    /// The WAL hook: the WAL holds `count` frames after a commit. Reads the frames the commit
    /// added and delivers them.
    public func committed(frames count: Int32) {
        deliver(Result { () throws(Failure) -> Commit in try read(upTo: UInt32(count)) })
    }

    /// Starts capture after frame `frames` of the WAL under `salt` (nil: the WAL was empty then):
    /// the next read delivers what came after it.
    public func resume(at salt: Salt?, frames: UInt32) throws(Failure) {
        self.salt = salt
        self.frames = salt == nil ? 0 : frames
    }

    /// The commits after the capture's position up to frame `count` (the last commit frame of the
    /// WAL, as ``resumeAfterCurrentContents()`` found it), as one.
    public func readCommits(through count: UInt32) throws(Failure) -> Commit {
        try read(upTo: count)
    }

    /// Every commit the WAL holds now (its frames of the header's salt up to the last commit
    /// frame), as one: a store whose WAL holds commits not known to be shipped (after a crash),
    /// or the WAL beside a base. Capture then goes on after them. Nil when it holds none.
    public func contentsAsOneCommit() throws(Failure) -> Commit? {
        let (salt, last) = try resumeAfterCurrentContents()
        guard salt != nil, last > 0 else { return nil }
        self.salt = nil // read from frame 1
        return try read(upTo: last)
    }

    private func read(upTo count: UInt32) throws(Failure) -> Commit {
        guard let header = try readHeader() else { throw Failure(description: "\(walPath) has no header after a commit") }
        var first = frames + 1
        if header.salt != salt || count < frames {
            // The WAL restarted since the last commit: this one starts at frame 1.
            first = 1
        }
        guard count >= first else { throw Failure(description: "\(walPath): the WAL holds \(count) frames, fewer than the \(first - 1) already read") }
        var commits = 0
        let frameSize = 24 + header.pageSize
        var latest: [UInt32: [UInt8]] = [:]
        var databasePages: UInt32 = 0
        var buffer = [UInt8](repeating: 0, count: frameSize)
        for frame in first...count {
            let offset = 32 + Int64(frame - 1) * Int64(frameSize)
            let read = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, frameSize, off_t(offset)) }
            guard read == frameSize else {
                throw Failure(description: "\(walPath): frame \(frame) could not be read (\(read < 0 ? String(cString: strerror(errno)) : "\(read) of \(frameSize) bytes"))")
            }
            let frameSalt = Salt(first: Self.bigEndian(buffer, 8), second: Self.bigEndian(buffer, 12))
            guard frameSalt == header.salt else { throw Failure(description: "\(walPath): frame \(frame) carries another salt than the WAL's header") }
            let number = Self.bigEndian(buffer, 0)
            latest[number] = Array(buffer[24...])
            if Self.bigEndian(buffer, 4) > 0 { commits += 1 }
            if frame == count {
                databasePages = Self.bigEndian(buffer, 4)
                guard databasePages > 0 else { throw Failure(description: "\(walPath): frame \(frame), the commit's last, is not a commit frame") }
            }
        }
        salt = header.salt
        frames = count
        let pages = latest.keys.sorted().map { Page(number: $0, data: latest[$0]!) }
        return Commit(pageSize: header.pageSize, databasePages: databasePages, pages: pages, salt: header.salt, frame: count, commits: commits)
    }

    /// The WAL's header (page size, salt); nil when the WAL is empty or absent.
    private func readHeader() throws(Failure) -> (pageSize: Int, salt: Salt)? {
        if descriptor < 0 {
            descriptor = open(walPath, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                if errno == ENOENT { return nil }
                throw Failure(description: "cannot open \(walPath): \(String(cString: strerror(errno)))")
            }
        }
        var header = [UInt8](repeating: 0, count: 32)
        let read = header.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, 32, 0) }
        if read == 0 { return nil }
        guard read == 32 else { throw Failure(description: "\(walPath): its header could not be read") }
        let magic = Self.bigEndian(header, 0)
        guard magic == 0x377f_0682 || magic == 0x377f_0683 else { throw Failure(description: "\(walPath) is not a WAL (magic \(String(magic, radix: 16)))") }
        let pageSize = Int(Self.bigEndian(header, 8))
        guard pageSize >= 512, pageSize <= 65536, pageSize & (pageSize - 1) == 0 else {
            throw Failure(description: "\(walPath): page size \(pageSize) in its header")
        }
        return (pageSize, Salt(first: Self.bigEndian(header, 16), second: Self.bigEndian(header, 20)))
    }

    static func bigEndian(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
        UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8 | UInt32(bytes[offset + 3])
    }
}

extension Result where Failure == WALCapture.Failure {
    init(_ body: () throws(WALCapture.Failure) -> Success) {
        do {
            self = .success(try body())
        } catch {
            self = .failure(error)
        }
    }
}
