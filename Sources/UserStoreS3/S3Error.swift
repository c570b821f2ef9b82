/// Why an S3 request failed, in the terms an operator acts on.
public enum S3Error: Error, Equatable, Sendable, CustomStringConvertible {
    /// No answer: the endpoint refused the connection, did not resolve, timed out, or TLS failed.
    case unreachable(String)
    /// The endpoint refused the credentials or their permissions (403: `InvalidAccessKeyId`,
    /// `SignatureDoesNotMatch`, `AccessDenied`).
    case accessDenied(String)
    /// The bucket does not exist (404 `NoSuchBucket`).
    case noSuchBucket(String)
    /// Any other error reply.
    case failed(status: Int, code: String, message: String)

    /// Whether it is the configuration's fault (a bucket that is not there, credentials it refuses),
    /// not an outage that passes.
    public var isMisconfiguration: Bool {
        switch self {
        case .accessDenied, .noSuchBucket: true
        case .unreachable, .failed: false
        }
    }

    /// The name userstored reports it under (`Status.replication.lastError`, the journal).
    public var name: String {
        switch self {
        case .unreachable: "ReplicaUnreachable"
        case .accessDenied: "ReplicaAccessDenied"
        case .noSuchBucket: "ReplicaBucketMissing"
        case .failed: "ReplicaRequestFailed"
        }
    }

    public var description: String {
        switch self {
        case .unreachable(let message): "\(name): the S3 endpoint cannot be reached: \(message)"
        case .accessDenied(let message): "\(name): the S3 endpoint refused the credentials: \(message)"
        case .noSuchBucket(let bucket): "\(name): the bucket \(bucket) does not exist"
        case .failed(let status, let code, let message): "\(name): S3 answered \(status) \(code): \(message)"
        }
    }
}
