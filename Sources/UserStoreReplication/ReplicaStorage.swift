import Foundation
import Synchronization
import UserStoreConfiguration
import UserStoreCore
import UserStoreS3

/// Where the replica lives: a `file://` folder or an `s3://` bucket (through ``S3Client``) —
/// the log's objects, folds, fences, the marker and the lease, and copies in Litestream's old
/// layout.
package struct ReplicaStorage: Sendable {
    package enum Kind: Sendable {
        case folder(String)
        case bucket(S3Client, bucket: String, prefix: String)
    }

    package let kind: Kind
    /// `litestream restore`'s environment for this replica (a copy in Litestream's layout, read
    /// once): the S3 credentials and CA, nothing inherited.
    package let litestreamEnvironment: [String: String]

    /// A replica that cannot be used as configured (no credentials, an unreadable CA).
    package struct Misconfigured: Error, CustomStringConvertible {
        package let description: String
    }

    /// The storage `settings` name; `environment` is the daemon's (for `AWS_*` credentials and
    /// `$CREDENTIALS_DIRECTORY`).
    package init(_ settings: ReplicationSettings, environment: [String: String] = ProcessInfo.processInfo.environment) throws(Misconfigured) {
        var base = ["PATH": environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"]
        if let home = environment["HOME"] { base["HOME"] = home }
        if settings.replica.hasPrefix("file://") {
            kind = .folder(String(settings.replica.dropFirst(7)).split(separator: "?").first.map(String.init) ?? "")
            litestreamEnvironment = base
        } else if let s3 = settings.s3 {
            let credentials = try Self.credentials(s3, environment: environment)
            let endpoint = s3.endpoint.map { S3Client.Endpoint(url: $0, region: s3.region, pathStyle: s3.forcePathStyle, caFile: s3.caFile) }
                ?? S3Client.Endpoint(url: "https://s3.\(s3.region).amazonaws.com", region: s3.region, pathStyle: s3.forcePathStyle, caFile: s3.caFile)
            do {
                // The daemon's own requests give up like a durable write does (at least 5 s):
                // a bucket that hangs must not hold an erase or a health check for long.
                let timeout = Duration.milliseconds(max(5000, settings.durableTimeoutMilliseconds))
                kind = .bucket(try S3Client(endpoint: endpoint, credentials: credentials, timeout: timeout), bucket: s3.bucket, prefix: s3.prefix)
            } catch {
                throw Misconfigured(description: "replication.s3.caFile: \(error)")
            }
            // Litestream's S3 client fails at once when AWS_CA_BUNDLE is set ("has no
            // WithTransportOptions"); Go reads a CA file from SSL_CERT_FILE instead.
            var variables = base.merging(credentials.environment) { $1 }
            if let ca = s3.caFile { variables["SSL_CERT_FILE"] = ca }
            litestreamEnvironment = variables
        } else {
            throw Misconfigured(description: "userstored replicates to file:// and s3:// replicas only (got \(settings.replica))")
        }
    }

    /// The access key: a systemd credential, else a credentials file, else the daemon's
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (or Litestream's `LITESTREAM_*` names).
    package static func credentials(_ s3: S3ReplicaSettings, environment: [String: String]) throws(Misconfigured) -> S3Credentials {
        do {
            if let name = s3.credential {
                guard let folder = environment["CREDENTIALS_DIRECTORY"] else {
                    throw Misconfigured(description: "replication.s3.credential: no $CREDENTIALS_DIRECTORY: the unit needs LoadCredential=\(name):/path/to/file")
                }
                return try S3Credentials.load(file: folder + "/" + name)
            }
            if let file = s3.credentialsFile { return try S3Credentials.load(file: file) }
        } catch let problem as S3Credentials.Problem {
            throw Misconfigured(description: "\(problem)")
        } catch let misconfigured as Misconfigured {
            throw misconfigured
        } catch {
            throw Misconfigured(description: "\(error)")
        }
        guard let credentials = S3Credentials.fromEnvironment(environment) else {
            throw Misconfigured(description: "an s3:// replica needs credentials: replication.s3.credentialsFile, replication.s3.credential (a systemd credential), or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the daemon's environment")
        }
        return credentials
    }

    /// Checks that the replica answers: the bucket exists and takes the credentials; the folder
    /// exists or can be made.
    package func check() async throws {
        switch kind {
        case .folder(let root):
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        case .bucket(let client, let bucket, _):
            try await client.checkBucket(bucket)
        }
    }

    /// Removes everything under the user folder `suffix` (`/ab/cd/user`, or `/bucket/user` with
    /// every epoch under it).
    package func erase(_ suffix: String) async throws {
        switch kind {
        case .folder(let root):
            let folder = root + suffix
            try await BlockingPool.run {
                if FileManager.default.fileExists(atPath: folder) { try FileManager.default.removeItem(atPath: folder) }
            }
        case .bucket(let client, let bucket, let prefix):
            // The trailing slash: erasing "ann" must not touch "anna".
            _ = try await client.deleteAll(bucket: bucket, prefix: Self.key(prefix, suffix) + "/")
        }
    }

    /// Whether anything is stored under the user folder `suffix`: one listing of at most one key
    /// in a bucket, a look into a folder. Throws when the replica does not answer.
    package func holdsAnything(_ suffix: String) async throws -> Bool {
        switch kind {
        case .folder(let root):
            let folder = root + suffix
            return try await BlockingPool.run {
                guard FileManager.default.fileExists(atPath: folder) else { return false }
                return try !FileManager.default.contentsOfDirectory(atPath: folder).isEmpty
            }
        case .bucket(let client, let bucket, let prefix):
            // The trailing slash: "ann" must not find "anna".
            return try await client.holdsAny(bucket: bucket, prefix: Self.key(prefix, suffix) + "/")
        }
    }

    /// Every user with anything under the replica's hash folders (`<prefix>/ab/cd/<user>/…`),
    /// from a listing of the whole bucket prefix; nil where the daemon keeps no index (not a
    /// bucket). Throws when the bucket does not answer.
    package func listUsers() async throws -> Set<String>? {
        guard case .bucket(let client, let bucket, let prefix) = kind else { return nil }
        let root = prefix.isEmpty ? "" : prefix + "/"
        var users: Set<String> = []
        for key in try await client.list(bucket: bucket, prefix: root).keys {
            let parts = key.dropFirst(root.count).split(separator: "/", omittingEmptySubsequences: false)
            if parts.count >= 4 { users.insert(String(parts[2])) }
        }
        return users
    }

    /// The newest epoch folder (`e<N>`) under the user folder `suffix` that holds LTX files;
    /// with `unfenced` (one host), 0 when none does but the folder itself holds Litestream's
    /// files (the layout from before the writer lease); nil when nothing does. Throws when the
    /// replica does not answer or a folder cannot be read.
    package func newestEpochWithData(_ suffix: String, unfenced: Bool = false) async throws -> Int64? {
        try await epochsWithData(suffix, unfenced: unfenced, all: false).first
    }

    /// Every epoch under the user folder `suffix` that holds LTX files, newest first (0 for the
    /// old layout with `unfenced`); only the newest unless `all`.
    package func epochsWithData(_ suffix: String, unfenced: Bool, all: Bool = true) async throws -> [Int64] {
        let names: [String]
        let holdsLTX: @Sendable (String) async throws -> Bool
        switch kind {
        case .folder(let root):
            let folder = root + suffix
            // A folder that cannot be read is an error, never "nothing there".
            names = try await BlockingPool.run { try Self.folderExists(root) ? try Self.entries(of: folder) ?? [] : [] }
            holdsLTX = { name in try await BlockingPool.run { try Self.holdsLTX(folder + "/" + name) } }
        case .bucket(let client, let bucket, let prefix):
            let folder = Self.key(prefix, suffix) + "/"
            let listed = try await client.list(bucket: bucket, prefix: folder, delimiter: "/").prefixes
            names = listed.map { String($0.dropFirst(folder.count).dropLast()) } // "e12/" → "e12"
            // One page of keys: Litestream's level folders hold nothing but LTX files.
            holdsLTX = { name in
                try await client.firstKeys(bucket: bucket, prefix: folder + name + "/", count: 100).contains { $0.hasSuffix(".ltx") }
            }
        }
        var found: [Int64] = []
        for epoch in names.compactMap(Self.epoch(ofFolder:)).sorted(by: >) where try await holdsLTX("e\(epoch)") {
            found.append(epoch)
            if !all { return found }
        }
        // Litestream's own folders directly under the user's (`ltx/0/…` in a folder, `0000/…` in
        // a bucket): the layout from before the writer lease.
        if unfenced {
            for name in names where Self.epoch(ofFolder: name) == nil {
                if try await holdsLTX(name) {
                    found.append(0)
                    break
                }
            }
        }
        return found
    }

    /// The names in `folder`; nil when it does not exist; throws when it cannot be read.
    static func entries(of folder: String) throws -> [String]? {
        do {
            return try FileManager.default.contentsOfDirectory(atPath: folder)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return nil
        }
    }

    /// Whether any `.ltx` file is under `folder` (a walk that throws when a folder cannot be read).
    static func holdsLTX(_ folder: String) throws -> Bool {
        guard let names = try entries(of: folder) else { return false }
        for name in names {
            if name.hasSuffix(".ltx") { return true }
            var status = stat()
            if lstat(folder + "/" + name, &status) == 0, status.st_mode & S_IFMT == S_IFDIR, try holdsLTX(folder + "/" + name) { return true }
        }
        return false
    }

    /// `N` for an epoch folder's name `eN`.
    static func epoch(ofFolder name: String) -> Int64? {
        name.hasPrefix("e") ? Int64(name.dropFirst()) : nil
    }

    /// `prefix` and a folder suffix (`/ab/cd/user`) as one key prefix without a leading slash.
    package static func key(_ prefix: String, _ suffix: String) -> String {
        prefix.isEmpty ? String(suffix.drop { $0 == "/" }) : prefix + suffix
    }
}
