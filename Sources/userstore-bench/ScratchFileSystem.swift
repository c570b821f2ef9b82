import Foundation

/// A folder on the file system a fleet scenario runs on: the root file system the benchmark
/// already uses, or a fresh journaled ext4 or XFS made in an image file and loop-mounted
/// (what production servers run; this VM's root is often ext4 without a journal).
struct ScratchFileSystem {
    /// How rows name it: `root (ext4, no journal)`, `ext4 (journaled, loop image)`, ...
    let label: String
    /// Where the scenario puts its files.
    let directory: String
    /// The image behind a mounted one (nil for the root file system).
    private let image: String?

    /// The root file system under `directory`, described by its type and, for ext4, whether it
    /// has a journal.
    static func root(_ directory: String) -> ScratchFileSystem {
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let fields = shell("findmnt -n -o SOURCE,FSTYPE -T \(directory)").1.split(whereSeparator: \.isWhitespace).map(String.init)
        var label = fields.count == 2 ? fields[1] : "unknown"
        if label == "ext4", fields.count == 2 {
            label += shell("dumpe2fs -h \(fields[0]) 2>/dev/null | grep -q has_journal").0 == 0 ? ", journaled" : ", no journal"
        }
        return ScratchFileSystem(label: "root (\(label))", directory: directory, image: nil)
    }

    /// A new `type` (`ext4` or `xfs`) file system of `bytes` in an image file under `root`,
    /// loop-mounted; nil (with the reason logged) when this machine cannot make or mount one.
    static func mounted(_ type: String, bytes: Int, under root: String) -> ScratchFileSystem? {
        guard shell("command -v mkfs.\(type)").0 == 0 else {
            log("  \(type): mkfs.\(type) is not installed; skipped")
            return nil
        }
        let image = root + "/\(type).img", directory = root + "/mnt-\(type)"
        let force = type == "xfs" ? "-f" : "-F"
        let (status, output) = shell("truncate -s \(bytes) \(image) && mkfs.\(type) -q \(force) \(image) && mkdir -p \(directory) && mount -o loop \(image) \(directory)")
        guard status == 0 else {
            log("  \(type): could not make or mount a loop image (\(output.trimmingCharacters(in: .whitespacesAndNewlines))); skipped")
            shell("rm -f \(image)")
            return nil
        }
        let journal = type == "ext4" ? "journaled, " : ""
        return ScratchFileSystem(label: "\(type) (\(journal)loop image)", directory: directory, image: image)
    }

    /// Unmounts and deletes a mounted one.
    func remove() {
        guard let image else { return }
        shell("umount \(directory) && rm -f \(image)")
    }

    /// Mean latency of `pwrite` + `fdatasync` of 4 KiB in this file system, in µs.
    func fsyncLatency() -> Double {
        let path = directory + "/fsync-probe"
        let fd = open(path, O_WRONLY | O_CREAT, 0o600)
        defer { close(fd); unlink(path) }
        var block = [UInt8](repeating: 7, count: 4096)
        let started = nanoseconds()
        for _ in 0..<200 {
            _ = block.withUnsafeMutableBytes { pwrite(fd, $0.baseAddress, 4096, 0) }
            fdatasync(fd)
        }
        return Double(nanoseconds() - started) / 200 / 1000
    }
}
