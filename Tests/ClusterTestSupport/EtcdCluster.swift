import Foundation
import Synchronization

/// Real etcd members (Debian's `etcd-server`, installed by scripts/install-deps.sh) on
/// 127.0.0.1, each with its own data folder under a temporary directory: started by the
/// test, killed and removed when it ends.
public final class EtcdCluster: @unchecked Sendable {
    public struct Member {
        let name: String
        let clientURL: String
        let peerURL: String
        var process: Process?
    }

    public private(set) var members: [Member]
    public let directory: String

    /// `size` members, started and answering (or throws after 20 s).
    public init(size: Int) throws {
        directory = NSTemporaryDirectory() + "etcd-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let ports = try Self.freePorts(2 * size)
        members = (0..<size).map { index in
            Member(name: "m\(index)", clientURL: "http://127.0.0.1:\(ports[2 * index])", peerURL: "http://127.0.0.1:\(ports[2 * index + 1])")
        }
        for index in members.indices { try start(index) }
        try waitUntilHealthy()
    }

    deinit {
        for member in members { if let process = member.process, process.isRunning { Foundation.kill(process.processIdentifier, SIGKILL); process.waitUntilExit() } }
        try? FileManager.default.removeItem(atPath: directory)
    }

    public var endpoints: [String] { members.map(\.clientURL) }

    public func start(_ index: Int) throws {
        let member = members[index]
        let initial = members.map { "\($0.name)=\($0.peerURL)" }.joined(separator: ",")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/etcd")
        process.arguments = [
            "--name", member.name, "--data-dir", "\(directory)/\(member.name)",
            "--listen-client-urls", member.clientURL, "--advertise-client-urls", member.clientURL,
            "--listen-peer-urls", member.peerURL, "--initial-advertise-peer-urls", member.peerURL,
            "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", directory,
            // Elections within a second on a loaded 2-core machine, not the default's 1 s+.
            "--heartbeat-interval", "100", "--election-timeout", "1000",
        ]
        process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
        _ = FileManager.default.createFile(atPath: "\(directory)/\(member.name).log", contents: nil)
        process.standardError = FileHandle(forWritingAtPath: "\(directory)/\(member.name).log")
        try process.run()
        members[index].process = process
    }

    /// SIGKILLs member `index`.
    public func kill(_ index: Int) {
        guard let process = members[index].process else { return }
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        members[index].process = nil
    }

    /// The index of the member that is leader now (nil when none answers as one).
    public func leader() -> Int? {
        for (index, member) in members.enumerated() where member.process != nil {
            guard let status = try? Self.post(member.clientURL + "/v3/maintenance/status", "{}"),
                  let leader = status["leader"] as? String, let id = (status["header"] as? [String: Any])?["member_id"] as? String else { continue }
            if leader == id { return index }
        }
        return nil
    }

    private func waitUntilHealthy() throws {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if leader() != nil, members.allSatisfy({ (try? Self.post($0.clientURL + "/v3/kv/range", "{\"key\":\"AA==\"}")) != nil }) { return }
            usleep(50_000) // etcd gives no readiness notice to wait on: poll its status
        }
        let logs = members.map { (try? String(contentsOfFile: "\(directory)/\($0.name).log", encoding: .utf8))?.suffix(2000) ?? "" }
        throw NSError(domain: "EtcdCluster", code: 1, userInfo: [NSLocalizedDescriptionKey: "etcd did not become healthy: \(logs)"])
    }

    /// A blocking POST with curl (the test's own HTTP path, independent of EtcdClient).
    public static func post(_ url: String, _ body: String) throws -> [String: Any]? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-s", "-f", "-m", "2", url, "-d", body]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { return nil }
        return try JSONSerialization.jsonObject(with: data) as? [String: Any]
    }

    /// Ports nobody listens on now, below the kernel's ephemeral range (32768 and up): a port
    /// the kernel handed out for "port 0" could be handed out again to another test's outgoing
    /// connection before the server bound it (SeaweedFS once failed with "address already in
    /// use" that way). Taken in turn from a random start, each checked by binding it.
    public static func freePorts(_ count: Int) throws -> [Int] {
        var ports: [Int] = []
        // At most one pass over the 12,000 ports of the range.
        for _ in 0..<12_000 where ports.count < count {
            let candidate = nextPort.withLock { next -> Int in
                if next == 0 { next = Int.random(in: 20_000..<32_000) }
                defer { next = next + 1 >= 32_000 ? 20_000 : next + 1 }
                return next
            }
            if isFree(candidate) { ports.append(candidate) }
        }
        guard ports.count == count else { throw NSError(domain: "EtcdCluster", code: 2, userInfo: [NSLocalizedDescriptionKey: "no free port"]) }
        return ports
    }

    private static let nextPort = Mutex(0)

    /// Whether `port` on 127.0.0.1 can be bound now.
    private static func isFree(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        return withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } } == 0
    }
}

extension EtcdCluster {
    /// SIGSTOPs member `index` (a pause: the process holds its sockets but answers nothing).
    public func pause(_ index: Int) { if let process = members[index].process { Foundation.kill(process.processIdentifier, SIGSTOP) } }
    /// SIGCONTs member `index`.
    public func resume(_ index: Int) { if let process = members[index].process { Foundation.kill(process.processIdentifier, SIGCONT) } }
}
