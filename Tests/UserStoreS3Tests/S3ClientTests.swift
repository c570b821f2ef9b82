import ClusterTestSupport
import Foundation
import Testing
@testable import UserStoreS3

/// The project's S3 client against two independent S3 implementations — SeaweedFS (which checks
/// every signature) and moto (`moto_server`) — with boto3 putting and listing objects on the
/// other side.
@Suite(.serialized) struct S3ClientTests {
    /// AWS's own worked example ("Signature Version 4: GET Object"), also what botocore signs.
    @Test func signsLikeAWSsWorkedExample() {
        let signer = SigV4(credentials: S3Credentials(accessKeyID: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
                           region: "us-east-1")
        let headers = signer.headers(method: "GET", path: "/test.txt", query: [],
                                     headers: [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9")],
                                     payloadHash: SigV4.emptyPayloadHash, date: Date(timeIntervalSince1970: 1_369_353_600))
        let authorization = headers.first { $0.0 == "authorization" }?.1 ?? ""
        #expect(authorization == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    }

    @Test func readsCredentialsFilesInBothForms() throws {
        let directory = NSTemporaryDirectory() + "s3-credentials-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "[other]\naws_access_key_id = X\naws_secret_access_key = Y\n\n[default]\naws_access_key_id = AKID\naws_secret_access_key = se=cret\n"
            .write(toFile: directory + "/ini", atomically: true, encoding: .utf8)
        try "AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY=\"se=cret\"\nAWS_SESSION_TOKEN=tok\n".write(toFile: directory + "/env", atomically: true, encoding: .utf8)
        try "aws_access_key_id = AKID\n".write(toFile: directory + "/half", atomically: true, encoding: .utf8)
        #expect(try S3Credentials.load(file: directory + "/ini") == S3Credentials(accessKeyID: "AKID", secretAccessKey: "se=cret"))
        #expect(try S3Credentials.load(file: directory + "/ini", profile: "other") == S3Credentials(accessKeyID: "X", secretAccessKey: "Y"))
        #expect(try S3Credentials.load(file: directory + "/env") == S3Credentials(accessKeyID: "AKID", secretAccessKey: "se=cret", sessionToken: "tok"))
        #expect(throws: S3Credentials.Problem.self) { try S3Credentials.load(file: directory + "/half") }
        #expect(throws: S3Credentials.Problem.self) { try S3Credentials.load(file: directory + "/missing") }
    }

    /// Lists (several pages), deletes a prefix and only that prefix; boto3 sees the result.
    @Test(arguments: ["seaweedfs", "moto"]) func listsAndDeletesUnderAPrefix(server kind: String) async throws {
        let server = try S3TestServer(kind)
        try server.probe(["create-bucket", "bucket-one"])
        let keys = ["ab/cd/ann/ltx/0/1.ltx", "ab/cd/ann/ltx/0/2.ltx", "ab/cd/ann+1@x.y/ltx/0/1.ltx", "ab/cd/anna/ltx/0/1.ltx", "other/key with space"]
        try server.probe(["put", "bucket-one"] + keys)
        let client = try S3Client(endpoint: .init(url: server.endpoint, region: "us-east-1", pathStyle: true), credentials: server.credentials)
        try await client.checkBucket("bucket-one")
        #expect(Set(try await client.list(bucket: "bucket-one", prefix: "", pageSize: 2).keys) == Set(keys))
        let folders = try await client.list(bucket: "bucket-one", prefix: "ab/cd/", delimiter: "/")
        #expect(Set(folders.prefixes) == ["ab/cd/ann/", "ab/cd/ann+1@x.y/", "ab/cd/anna/"] && folders.keys.isEmpty)
        #expect(try await client.deleteAll(bucket: "bucket-one", prefix: "ab/cd/ann/") == 2)
        #expect(try await client.deleteAll(bucket: "bucket-one", prefix: "ab/cd/ann+1@x.y/") == 1)
        #expect(Set(try server.keys("bucket-one")) == ["ab/cd/anna/ltx/0/1.ltx", "other/key with space"])
    }

    /// Objects read and written by compare-and-swap, what the replica's marker and writer lease
    /// stand on: a create that finds the key taken and a write on a stale entity tag are both
    /// refused (nil), nothing is written; boto3 reads what the client wrote.
    @Test(arguments: ["seaweedfs", "moto"]) func conditionalWritesCompareAndSwap(server kind: String) async throws {
        let server = try S3TestServer(kind)
        try server.probe(["create-bucket", "bucket-cas"])
        let client = try S3Client(endpoint: .init(url: server.endpoint, region: "us-east-1", pathStyle: true), credentials: server.credentials)
        #expect(try await client.getObject(bucket: "bucket-cas", key: "p/lease") == nil)
        let first = try #require(try await client.putObject(bucket: "bucket-cas", key: "p/lease", body: Data("one".utf8), condition: .absent))
        #expect(try await client.putObject(bucket: "bucket-cas", key: "p/lease", body: Data("two".utf8), condition: .absent) == nil)
        let read = try #require(try await client.getObject(bucket: "bucket-cas", key: "p/lease"))
        #expect(read.body == Data("one".utf8) && read.etag == first)
        let second = try #require(try await client.putObject(bucket: "bucket-cas", key: "p/lease", body: Data("three".utf8), condition: .matching(first)))
        #expect(second != first)
        #expect(try await client.putObject(bucket: "bucket-cas", key: "p/lease", body: Data("four".utf8), condition: .matching(first)) == nil)
        #expect(try await client.getObject(bucket: "bucket-cas", key: "p/lease")?.body == Data("three".utf8))
        #expect(try server.keys("bucket-cas") == ["p/lease"])
        try await client.deleteObject(bucket: "bucket-cas", key: "p/lease")
        #expect(try await client.getObject(bucket: "bucket-cas", key: "p/lease") == nil)
    }

    /// What an operator's mistake looks like: a bucket that is not there, a wrong secret, an
    /// endpoint nobody serves — each its own named error.
    @Test func misconfigurationsAreNamed() async throws {
        let server = try S3TestServer("seaweedfs")
        try server.probe(["create-bucket", "bucket-two"])
        let endpoint = S3Client.Endpoint(url: server.endpoint, region: "us-east-1", pathStyle: true)
        let good = try S3Client(endpoint: endpoint, credentials: server.credentials)
        await #expect(throws: S3Error.noSuchBucket("missing")) { try await good.checkBucket("missing") }
        let wrong = try S3Client(endpoint: endpoint, credentials: S3Credentials(accessKeyID: SeaweedFS.accessKey, secretAccessKey: "wrong"))
        do {
            try await wrong.checkBucket("bucket-two")
            Issue.record("a wrong secret was accepted")
        } catch {
            #expect(error.name == "ReplicaAccessDenied", "\(error)")
        }
        let port = try EtcdCluster.freePorts(1)[0]
        let nobody = try S3Client(endpoint: .init(url: "http://127.0.0.1:\(port)", region: "us-east-1", pathStyle: true), credentials: server.credentials)
        do {
            try await nobody.checkBucket("bucket-two")
            Issue.record("an endpoint nobody serves answered")
        } catch {
            #expect(error.name == "ReplicaUnreachable", "\(error)")
        }
    }
}

/// SeaweedFS (verifies signatures) or moto's server (a second implementation), on loopback.
final class S3TestServer {
    let endpoint: String
    let credentials = S3Credentials(accessKeyID: SeaweedFS.accessKey, secretAccessKey: SeaweedFS.secretKey)
    private var seaweed: SeaweedFS?
    private var moto: Process?

    init(_ kind: String) throws {
        if kind == "seaweedfs" {
            let server = try SeaweedFS()
            seaweed = server
            endpoint = server.endpoint
            return
        }
        let port = try EtcdCluster.freePorts(1)[0]
        endpoint = "http://127.0.0.1:\(port)"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: SeaweedFS.testenvPath + "/bin/python3")
        process.arguments = ["-m", "moto.server", "-H", "127.0.0.1", "-p", "\(port)"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        moto = process
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, (try? probe(["ready"]))?.status != 0 { usleep(100_000) } // no readiness notice
    }

    deinit {
        if let moto, moto.isRunning { kill(moto.processIdentifier, SIGKILL); moto.waitUntilExit() }
    }

    @discardableResult
    func probe(_ arguments: [String]) throws -> (status: Int32, output: String) {
        let result = try SeaweedFS.probe(endpoint: endpoint, environment: ["AWS_ACCESS_KEY_ID": credentials.accessKeyID, "AWS_SECRET_ACCESS_KEY": credentials.secretAccessKey], arguments)
        if result.status != 0 && arguments.first != "ready" { Issue.record("s3-probe \(arguments): \(result.output)") }
        return result
    }

    func keys(_ bucket: String) throws -> [String] {
        try probe(["list", bucket]).output.split(separator: "\n").map(String.init)
    }
}
