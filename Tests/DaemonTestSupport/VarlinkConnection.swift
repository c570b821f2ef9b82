import CUnixSocket
import Varlink
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A blocking varlink client connection over a Unix socket, for the tests that speak the
/// protocol itself (raw bytes, malformed calls, descriptor passing, pipelining). Applications
/// and the repo's tools use UserStoreClient. Not thread-safe: one caller at a time.
public final class VarlinkConnection {
    /// The socket path.
    public let path: String
    /// The socket's file descriptor (tests poll it or shut it down half-way).
    public let descriptor: Int32
    private var buffer: [UInt8] = []
    private var chunk = [UInt8](repeating: 0, count: 65_536)
    private let parser = JSONParser(maxDepth: 512)

    /// Why a connection failed at the transport level (as opposed to a varlink error reply).
    public enum TransportError: Error, Equatable, Sendable, CustomStringConvertible {
        case cannotConnect(path: String, message: String, errno: Int32)
        case closed(path: String)
        case io(path: String, message: String)
        case malformedReply(path: String, message: String)

        public var description: String {
            switch self {
            case .cannotConnect(let path, let message, _): return "cannot connect to \(path): \(message)"
            case .closed(let path): return "\(path): the daemon closed the connection"
            case .io(let path, let message): return "\(path): \(message)"
            case .malformedReply(let path, let message): return "\(path): malformed reply: \(message)"
            }
        }
    }

    /// Connects to `path`.
    public init(path: String) throws(TransportError) {
        self.path = path
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .cannotConnect(path: path, message: String(cString: strerror(errno)), errno: errno) }
        guard let result = UnixSocketAddress.with(path: path, { connect(fd, $0, $1) }) else {
            close(fd)
            throw .cannotConnect(path: path, message: "socket path too long", errno: ENAMETOOLONG)
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw .cannotConnect(path: path, message: String(cString: strerror(code)), errno: code)
        }
        descriptor = fd
    }

    /// Talks over `descriptor`, a connected socket this connection now owns (one end of a
    /// `socketpair` whose other end the daemon serves); `name` stands for the path in errors.
    public init(descriptor: Int32, name: String) {
        self.path = name
        self.descriptor = descriptor
    }

    deinit {
        close(descriptor)
    }

    /// Sends raw bytes (tests use this for malformed input).
    public func send(raw bytes: [UInt8]) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written < 0 {
                if errno == EINTR { continue }
                throw .io(path: path, message: "write failed: \(String(cString: strerror(errno)))")
            }
            offset += written
        }
    }

    /// Sends a call; `descriptors` travel with it (`SCM_RIGHTS`, at most 16), as systemd's
    /// varlink clients pass files.
    public func send(_ call: VarlinkCall, descriptors: [Int32] = []) throws(TransportError) {
        var writer = JSONWriter()
        writer.write(call.message)
        writer.raw(byte: 0)
        guard !descriptors.isEmpty else { return try send(raw: writer.bytes) }
        // The descriptors go with the first bytes; the rest of a long message follows as usual.
        let sent = writer.bytes.withUnsafeBytes { bytes in
            descriptors.withUnsafeBufferPointer { fds in
                us_send_with_fds(descriptor, bytes.baseAddress, bytes.count, fds.baseAddress, Int32(fds.count))
            }
        }
        guard sent > 0 else { throw .io(path: path, message: "write failed: \(String(cString: strerror(errno)))") }
        if sent < writer.bytes.count { try send(raw: Array(writer.bytes[sent...])) }
    }

    /// Reads the next NUL-terminated message.
    public func readFrame() throws(TransportError) -> [UInt8] {
        while true {
            if let end = buffer.firstIndex(of: 0) {
                let frame = Array(buffer[..<end])
                buffer.removeSubrange(...end)
                return frame
            }
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count < 0 {
                if errno == EINTR { continue }
                throw .io(path: path, message: "read failed: \(String(cString: strerror(errno)))")
            }
            if count == 0 { throw .closed(path: path) }
            buffer.append(contentsOf: chunk[..<count])
        }
    }

    /// Reads and decodes the next reply.
    public func readReply() throws(TransportError) -> VarlinkReplyMessage {
        let frame = try readFrame()
        do {
            return try VarlinkReplyMessage(message: try parser.parse(frame))
        } catch {
            throw .malformedReply(path: path, message: "\(error)")
        }
    }

    /// Calls `method` and returns its single reply; a varlink error reply is thrown as
    /// ``VarlinkError``, a transport failure as ``TransportError``.
    public func call(_ method: String, _ parameters: [String: JSONValue] = [:], descriptors: [Int32] = []) throws -> [String: JSONValue] {
        try send(VarlinkCall(method: method, parameters: parameters), descriptors: descriptors)
        return try readReply().checked().parameters
    }

    /// Calls `method` with `more` and hands each reply to `body` until the last.
    public func stream(_ method: String, _ parameters: [String: JSONValue] = [:], _ body: ([String: JSONValue]) throws -> Void) throws {
        try send(VarlinkCall(method: method, parameters: parameters, more: true))
        while true {
            let reply = try readReply().checked()
            try body(reply.parameters)
            if !reply.continues { return }
        }
    }

    /// Hangs up now (a client that goes away in the middle of a call).
    public func hangUp() {
        shutdown(descriptor, Int32(SHUT_RDWR))
    }

    /// Sets a receive timeout (0: none), so a test never hangs on a silent daemon.
    public func setReceiveTimeout(seconds: Int) {
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }
}

/// The varlink error `body` threw, or nil when it returned (or threw something else): for
/// asserting which named error a call is refused with.
public func varlinkError(_ body: () throws -> Void) -> VarlinkError? {
    do {
        try body()
        return nil
    } catch {
        return error as? VarlinkError
    }
}
