import CZstd
import Foundation

/// Compression of the host log's objects: whole zstd frames, with zstd's own content checksum
/// (XXH64 of the uncompressed bytes) so that a damaged object is told from a good one.
package enum Zstd {
    /// Why bytes did not decompress: not a zstd frame, truncated, or its checksum does not match.
    package struct Failure: Error, CustomStringConvertible, Sendable {
        package let description: String
    }

    /// `bytes` as one zstd frame (level `level`; 1–3 are fast), its size and checksum in its header.
    package static func compress(_ bytes: [UInt8], level: Int32 = 3) -> [UInt8] {
        guard let context = ZSTD_createCCtx() else { fatalError("ZSTD_createCCtx: out of memory") }
        defer { ZSTD_freeCCtx(context) }
        ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel, level)
        ZSTD_CCtx_setParameter(context, ZSTD_c_checksumFlag, 1)
        var output = [UInt8](repeating: 0, count: ZSTD_compressBound(bytes.count))
        let written = output.withUnsafeMutableBytes { target in
            bytes.withUnsafeBytes { source in
                ZSTD_compress2(context, target.baseAddress, target.count, source.baseAddress, source.count)
            }
        }
        precondition(ZSTD_isError(written) == 0, "ZSTD_compress2: \(String(cString: ZSTD_getErrorName(written)))")
        output.removeSubrange(written...)
        return output
    }

    /// The bytes of the zstd frame `frame`, at most `limit` of them (a frame that claims more is
    /// refused before anything is allocated).
    package static func decompress(_ frame: [UInt8], limit: Int = 1 << 30) throws(Failure) -> [UInt8] {
        let size = frame.withUnsafeBytes { ZSTD_getFrameContentSize($0.baseAddress, $0.count) }
        guard size != ZSTD_CONTENTSIZE_ERROR else { throw Failure(description: "not a zstd frame") }
        guard size != ZSTD_CONTENTSIZE_UNKNOWN, size <= UInt64(limit) else {
            throw Failure(description: "a zstd frame of \(size == ZSTD_CONTENTSIZE_UNKNOWN ? "unknown size" : "\(size) bytes") (at most \(limit))")
        }
        var output = [UInt8](repeating: 0, count: Int(size))
        let read = output.withUnsafeMutableBytes { target in
            frame.withUnsafeBytes { source in ZSTD_decompress(target.baseAddress, target.count, source.baseAddress, source.count) }
        }
        guard ZSTD_isError(read) == 0 else { throw Failure(description: String(cString: ZSTD_getErrorName(read))) }
        guard read == size else { throw Failure(description: "a zstd frame gave \(read) of its \(size) bytes") }
        return output
    }
}
