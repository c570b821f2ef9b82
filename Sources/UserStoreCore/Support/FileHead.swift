#if canImport(Glibc)
import Glibc
#endif

/// The first bytes of a file and its size, read with three system calls (open, fstat, pread)
/// and one allocation. Opening a store reads two headers this way (the database's and its
/// WAL's) — once per store in a fleet run of thousands, where Foundation's `FileHandle` cost
/// several allocations and an `NSData` each.
struct FileHead {
    /// The file's size in bytes.
    let size: UInt64
    /// Up to the requested count of bytes from the start (fewer when the file is shorter).
    let bytes: [UInt8]

    /// Reads up to `count` bytes of the file at `path`; nil when it cannot be opened or read
    /// (missing, not readable, or an I/O error: whoever opens it next meets that error).
    init?(path: String, count: Int) {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { return nil }
        var read = 0, failed = false
        let bytes = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            while read < count {
                let got = pread(descriptor, buffer.baseAddress! + read, count - read, off_t(read))
                if got < 0, errno == EINTR { continue }
                if got < 0 { failed = true }
                guard got > 0 else { break }
                read += got
            }
            initialized = read
        }
        guard !failed else { return nil }
        self.size = UInt64(status.st_size)
        self.bytes = bytes
    }

    /// The size of the file at `path` without opening it; nil when it does not exist.
    static func size(of path: String) -> UInt64? {
        var status = stat()
        return stat(path, &status) == 0 ? UInt64(status.st_size) : nil
    }
}
