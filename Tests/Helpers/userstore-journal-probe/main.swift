// Journal probe for the layer-1 tests, run inside a private mount namespace with a tmpfs on
// /run/systemd (so libsystemd's hard-coded socket path is ours):
//
//   userstore-journal-probe wire    binds /run/systemd/journal/socket, logs entries through the
//                                   daemon's JournalLogHandler, reads the datagrams back and
//                                   prints every field as JSON lines {"name":..,"base64":..}
//   userstore-journal-probe flood   binds the socket and never reads it; logs 100,000 entries;
//                                   prints the writer's counters as JSON
import Foundation
import Varlink
import Logging
import UserStoreJournal

let socketPath = "/run/systemd/journal/socket"

func bindJournalSocket() -> Int32 {
    try? FileManager.default.createDirectory(atPath: "/run/systemd/journal", withIntermediateDirectories: true)
    unlink(socketPath)
    let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
    let result = UnixSocketAddress.with(path: socketPath) { bind(fd, $0, $1) }
    guard fd >= 0, result == 0 else {
        FileHandle.standardError.write(Data("cannot bind \(socketPath): \(String(cString: strerror(errno)))\n".utf8))
        exit(2)
    }
    return fd
}

/// Parses one datagram of journald's native protocol into (name, value) pairs.
func parse(_ bytes: [UInt8]) -> [(String, [UInt8])] {
    var fields: [(String, [UInt8])] = []
    var index = 0
    while index < bytes.count {
        guard let end = bytes[index...].firstIndex(where: { $0 == UInt8(ascii: "=") || $0 == UInt8(ascii: "\n") }) else { break }
        let name = String(decoding: bytes[index..<end], as: UTF8.self)
        if bytes[end] == UInt8(ascii: "=") {
            let lineEnd = bytes[(end + 1)...].firstIndex(of: UInt8(ascii: "\n")) ?? bytes.count
            fields.append((name, Array(bytes[(end + 1)..<lineEnd])))
            index = lineEnd + 1
        } else {
            // Binary-safe form: NAME\n<little-endian 64-bit length><bytes>\n
            let lengthStart = end + 1
            var length = 0
            for offset in 0..<8 { length |= Int(bytes[lengthStart + offset]) << (8 * offset) }
            let valueStart = lengthStart + 8
            fields.append((name, Array(bytes[valueStart..<(valueStart + length)])))
            index = valueStart + length + 1
        }
    }
    return fields
}

func emit(_ object: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    FileHandle.standardOutput.write(data + Data("\n".utf8))
}

switch CommandLine.arguments.dropFirst().first {
case "wire":
    let fd = bindJournalSocket()
    let writer = JournalWriter()
    var logger = Logger(label: "probe") { _ in JournalLogHandler(writer: writer) }
    logger.logLevel = .debug
    logger.error("migration 3 failed", metadata: [
        "event": "migration-failed", "user": "alice", "version": "3",
        "sqlite_message": "near \"FROM\": syntax error\nsecond line",
        "weird key.name-9": "sanitised", "binary": .string("a\u{0}b"),
    ])
    logger.notice("plain entry", metadata: ["user": "bob"])
    for _ in 0..<2 {
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { exit(3) }
        let fields = parse(Array(buffer[..<count]))
        emit(["fields": fields.map { ["name": $0.0, "base64": Data($0.1).base64EncodedString()] },
              "binarySafe": fields.map(\.0).filter { name in
                  // Names whose value used the length-prefixed form.
                  let marker = Array((name + "\n").utf8)
                  return buffer[..<count].starts(with: marker) || (0..<(count - marker.count)).contains { offset in
                      buffer[offset] == UInt8(ascii: "\n") && Array(buffer[(offset + 1)..<min(count, offset + 1 + marker.count)]) == marker
                  }
              }])
    }
    print(#"{"counters":{"sent":\#(writer.counters.sent),"failures":\#(writer.counters.failures)}}"#)
case "flood":
    _ = bindJournalSocket() // bound, never read: sd_journal_sendv blocks after a few datagrams
    let writer = JournalWriter()
    let logger = Logger(label: "probe") { _ in JournalLogHandler(writer: writer) }
    let started = ContinuousClock.now
    for index in 0..<100_000 {
        logger.info("flood entry", metadata: ["event": "slow-request", "user": "u\(index % 100)"])
    }
    let elapsed = ContinuousClock.now - started
    let counters = writer.counters
    emit(["logged": 100_000, "dropped": counters.dropped, "waiting": counters.waiting, "capacity": writer.capacity,
          "elapsedMilliseconds": Int(elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000)])
default:
    FileHandle.standardError.write(Data("usage: userstore-journal-probe wire|flood\n".utf8))
    exit(2)
}
