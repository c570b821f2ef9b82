import Configuration
import Foundation
import UserStoreCore

extension ConfigurationLoader {
    /// Reads typed values, turning every missing-or-wrong value into a ``ConfigurationError``
    /// that names its key. (swift-configuration's `default:` variants would silently fall back
    /// to the default on a wrong type.)
    struct Reader {
        let reader: ConfigReader
        let file: String
        /// Keys present in the file or the environment (swift-configuration does not tell a
        /// missing key from a mistyped one).
        let present: Set<String>

        func configuration() throws(ConfigurationError) -> DaemonConfiguration {
            let appVersionText = try string(.appVersion) ?? ""
            guard !appVersionText.isEmpty else { throw error(.appVersion, "is required: the app version recorded in every store, e.g. \"1.4.2\"") }
            let appVersion: AppVersion
            do { appVersion = try AppVersion(appVersionText) } catch { throw self.error(.appVersion, error.description) }

            var policy = MigrationPolicy()
            policy.allowOutOfOrder = try bool(.migrationsAllowOutOfOrder) ?? false
            if let mismatch = try string(.migrationsChecksumMismatch) {
                guard let value = MigrationPolicy.ChecksumMismatch(rawValue: mismatch) else {
                    throw error(.migrationsChecksumMismatch, "must be refuse or warn (got \"\(mismatch)\")")
                }
                policy.checksumMismatch = value
            }
            switch try string(.migrationsOnFailure) ?? "refuse" {
            case "refuse": policy.servePreviousVersionOnFailure = false
            case "serve-previous": policy.servePreviousVersionOnFailure = true
            case let other: throw error(.migrationsOnFailure, "must be refuse or serve-previous (got \"\(other)\")")
            }
            policy.backupBeforeMigrating = try backupMode(.migrationsBackupBeforeMigrating) ?? .auto
            policy.backupRetentionSeconds = try int(.migrationsBackupRetentionSeconds, minimum: 0) ?? 86_400
            policy.allowDestructiveSchemaChanges = try bool(.migrationsAllowDestructiveSchemaChanges) ?? false
            policy.newStoresFromTemplate = try bool(.migrationsNewStoresFromTemplate) ?? false
            if let method = try string(.migrationsFleetSyncMethod) {
                guard let value = MigrationPolicy.FleetSyncMethod(rawValue: method) else {
                    throw error(.migrationsFleetSyncMethod, "must be syncfs or fsync (got \"\(method)\")")
                }
                policy.fleetSyncMethod = value
            }

            var access = AccessRules()
            access.clientUsers = try ids(.accessClientUsers, resolve: AccessRules.resolveUser)
            access.clientGroups = try ids(.accessClientGroups, resolve: AccessRules.resolveGroup)
            access.adminUsers = try ids(.accessAdminUsers, resolve: AccessRules.resolveUser)
            access.adminGroups = try ids(.accessAdminGroups, resolve: AccessRules.resolveGroup)
            access.perUnixUserStores = try bool(.accessPerUnixUserStores) ?? false

            var limits = RequestLimits()
            limits.maxRequestBytes = try int(.limitsMaxRequestBytes, minimum: 1024) ?? limits.maxRequestBytes
            limits.maxResponseBytes = try int(.limitsMaxResponseBytes, minimum: 1024) ?? limits.maxResponseBytes
            limits.statementTimeoutMilliseconds = try int(.limitsStatementTimeoutMilliseconds, minimum: 1) ?? limits.statementTimeoutMilliseconds
            limits.maxBatchStatements = try int(.limitsMaxBatchStatements, minimum: 1) ?? limits.maxBatchStatements
            limits.maxConnections = try int(.limitsMaxConnections, minimum: 1) ?? limits.maxConnections
            limits.maxJSONDepth = try int(.limitsMaxJSONDepth, minimum: 8, maximum: 1000) ?? limits.maxJSONDepth
            limits.transactionIdleMilliseconds = try int(.limitsTransactionIdleMilliseconds, minimum: 1) ?? limits.transactionIdleMilliseconds
            limits.transactionMilliseconds = try int(.limitsTransactionMilliseconds, minimum: 1) ?? limits.transactionMilliseconds
            limits.requestReadSeconds = try int(.limitsRequestReadSeconds, minimum: 1) ?? limits.requestReadSeconds
            limits.idleConnectionSeconds = try int(.limitsIdleConnectionSeconds, minimum: 1) ?? limits.idleConnectionSeconds
            limits.maxConnectionsPerUser = try int(.limitsMaxConnectionsPerUser, minimum: 1) ?? limits.maxConnectionsPerUser
            limits.watchMaxBufferedBytes = try int(.watchMaxBufferedBytes, minimum: 4096) ?? limits.watchMaxBufferedBytes
            var watch: ChangeRetention? = ChangeRetention()
            watch?.keepChanges = try int(.watchKeepChanges, minimum: 1) ?? ChangeRetention().keepChanges
            watch?.keepSeconds = try int(.watchKeepSeconds, minimum: 1) ?? ChangeRetention().keepSeconds
            if try bool(.watchEnabled) == false { watch = nil }

            var socketMode: UInt32 = 0o660
            if let mode = try string(.socketMode) {
                guard let parsed = UInt32(mode, radix: 8), parsed <= 0o777, parsed & 0o007 == 0 else {
                    throw error(.socketMode, "must be an octal mode without permissions for others, as a quoted string like \"0660\" (got \"\(mode)\")")
                }
                socketMode = parsed
            }
            var metricsListen: MetricsAddress?
            if var listen = try string(.metricsListen) {
                // A Unix socket's path may be relative to this file's folder, like every path here.
                if listen.hasPrefix("unix:"), !listen.dropFirst(5).hasPrefix("/"), listen.count > 5 {
                    listen = "unix:" + URL(fileURLWithPath: file).deletingLastPathComponent().appendingPathComponent(String(listen.dropFirst(5))).standardizedFileURL.path
                }
                guard let address = MetricsAddress(listen) else {
                    throw error(.metricsListen, "must be host:port (127.0.0.1:9464, [::1]:9464) or unix:/absolute/path (got \"\(listen)\")")
                }
                metricsListen = address
            }
            let dataDirectory = try path(.dataDirectory, default: "/var/lib/userstore")
            let replication = try replicationSettings(dataDirectory: dataDirectory)
            let logTargetText = try string(.logTarget) ?? "auto"
            guard let logTarget = DaemonConfiguration.LogTarget(rawValue: logTargetText) else {
                throw error(.logTarget, "must be auto, journal or stderr (got \"\(logTargetText)\")")
            }
            var configuration = DaemonConfiguration(
                appVersion: appVersion,
                dataDirectory: dataDirectory,
                socketPath: try path(.socketPath, default: "/run/userstore/userstore.sock"),
                socketMode: socketMode,
                socketGroup: try string(.socketGroup),
                migrationsDirectory: try path(.migrationsDirectory, default: "/etc/userstore/migrations"),
                schemaFile: try string(.schemaFile) == nil ? nil : try path(.schemaFile, default: ""),
                maxOpenStores: try int(.maxOpenStores, minimum: 1, maximum: 1_000_000) ?? 1024,
                idleTimeoutSeconds: try int(.idleTimeoutSeconds, minimum: 1) ?? 300,
                policy: policy, access: access, limits: limits, logTarget: logTarget,
                slowRequestMilliseconds: try int(.slowRequestMilliseconds, minimum: 1) ?? 1000,
                fleetParallelism: try int(.fleetParallelism, minimum: 1, maximum: 256) ?? DaemonConfiguration.defaultFleetParallelism,
                sourcePath: file, metricsListen: metricsListen, replication: replication, cluster: try clusterSettings(replica: replication?.replica),
                rollout: try rolloutPolicy())
            configuration.watch = watch
            configuration.cacheIdleSeconds = try int(.cacheIdleSeconds, minimum: 0, maximum: 86_400) ?? 1
            configuration.encryption = try encryptionSettings()
            return configuration
        }

        /// Whether one of two paths (folders, or prefixes of one bucket) is the other or lies
        /// inside it, component by component (`a/b` holds `a/b/c`, not `a/bc`; "" holds all).
        static func nested(_ one: String, _ other: String) -> Bool {
            let (a, b) = (one.split(separator: "/"), other.split(separator: "/"))
            return a.starts(with: b) || b.starts(with: a)
        }

        /// `path` with `.` and `..` resolved, and its symbolic links where it exists (the part
        /// that exists: a key store's folder may not be made yet).
        static func canonical(_ path: String) -> String {
            var existing = URL(fileURLWithPath: path).standardizedFileURL
            var rest: [String] = []
            while existing.path != "/", !FileManager.default.fileExists(atPath: existing.path) {
                rest.insert(existing.lastPathComponent, at: 0)
                existing.deleteLastPathComponent()
            }
            return ([existing.resolvingSymlinksInPath().path] + rest).joined(separator: "/")
        }

        /// `encryption.*`: nil without any of its keys.
        private func encryptionSettings() throws(ConfigurationError) -> EncryptionSettings? {
            guard let first = firstPresent(in: "encryption") else { return nil }
            guard let location = try string(.encryptionKeyStore) else {
                throw error(first, "needs encryption.keyStore too: where the wrapped data keys are kept (file:///path, on another disk than dataDirectory)")
            }
            var settings: EncryptionSettings
            let replica = try string(.replicationReplica)
            if location.hasPrefix("file:///"), location.count > "file:///".count {
                let folder = String(location.dropFirst("file://".count))
                if let replica, replica.hasPrefix("file:///"), Self.nested(Self.canonical(folder), Self.canonical(String(replica.dropFirst("file://".count)))) {
                    throw error(.encryptionKeyStore, "is the replica's folder, or inside it, or holds it: keep the keys apart from the data (a folder of their own)")
                }
                settings = EncryptionSettings(keyStore: .folder(folder))
            } else if location.hasPrefix("s3://"), location.count > "s3://".count {
                let s3 = try s3Settings(location, key: .encryptionKeyStore)
                if let replica, replica.hasPrefix("s3://"), let replicaS3 = try? s3Settings(replica), replicaS3.bucket == s3.bucket,
                   Self.nested(s3.prefix, replicaS3.prefix) {
                    throw error(.encryptionKeyStore, "is the replica's own bucket and prefix, or a prefix inside it or holding it: keep the keys apart from the data (another bucket, or another prefix)")
                }
                settings = EncryptionSettings(keyStore: .bucket(s3))
            } else if location == "etcd" {
                guard present.contains(ConfigurationKey.clusterEtcd.rawValue) else {
                    throw error(.encryptionKeyStore, "etcd is the key store of a cluster: set cluster.etcd too, or use file:///absolute/path or s3://bucket/prefix")
                }
                settings = EncryptionSettings(keyStore: .etcd)
            } else {
                throw error(.encryptionKeyStore, "must be file:///absolute/path, s3://bucket/prefix or etcd (got \"\(location)\")")
            }
            if try string(.encryptionKeyFile) != nil {
                let file = try path(.encryptionKeyFile, default: "")
                guard FileManager.default.isReadableFile(atPath: file) else { throw error(.encryptionKeyFile, "cannot read \(file)") }
                settings.keyFile = file
            }
            if let name = try string(.encryptionCredential) {
                guard !name.isEmpty, !name.contains("/") else { throw error(.encryptionCredential, "must be a systemd credential's name (LoadCredentialEncrypted=NAME:…), got \"\(name)\"") }
                settings.credential = name
            }
            guard settings.keyFile != nil || settings.credential != nil else {
                throw error(.encryptionKeyFile, "is required with encryption.keyStore (or encryption.credential): the key-encryption key, 32 bytes raw or base64 (head -c 32 /dev/urandom | base64)")
            }
            return settings
        }

        /// `rollout.*`: nil (releases are not staged) without `rollout.steps`.
        private func rolloutPolicy() throws(ConfigurationError) -> RolloutPolicy? {
            let stepsText: String?
            if let list = try? reader.requiredStringArray(forKey: ConfigKey(ConfigurationKey.rolloutSteps.rawValue)) {
                stepsText = list.joined(separator: ",")
            } else {
                stepsText = try optional(.rolloutSteps, expected: "percentages, e.g. \"1%,10%,50%,100%\" or [1%, 10%, 50%, 100%]") {
                    try reader.requiredString(forKey: ConfigKey(ConfigurationKey.rolloutSteps.rawValue))
                }
            }
            guard let stepsText else {
                if let key = firstPresent(in: "rollout") {
                    throw error(.rolloutSteps, "is required when \(key.rawValue) is set: the steps of a release, e.g. \"1%,10%,50%,100%\"")
                }
                return nil
            }
            var waitSeconds = RolloutPolicy.defaultWaitSeconds
            if let seconds = try? reader.requiredInt(forKey: ConfigKey(ConfigurationKey.rolloutWait.rawValue)), seconds >= 0 {
                waitSeconds = seconds
            } else if let wait = try string(.rolloutWait) {
                guard let seconds = RolloutPolicy.parseDuration(wait) else { throw error(.rolloutWait, "must be a duration like 90s, 10m or 2h (got \"\(wait)\")") }
                waitSeconds = seconds
            }
            var haltOn = RolloutPolicy.defaultHaltOn
            if let number = try? reader.requiredDouble(forKey: ConfigKey(ConfigurationKey.rolloutHaltOn.rawValue)) {
                haltOn = number / 100
            } else if let text = try string(.rolloutHaltOn) {
                guard let percent = RolloutPolicy.parsePercent(text) else { throw error(.rolloutHaltOn, "must be a percentage like 1% (got \"\(text)\")") }
                haltOn = percent / 100
            }
            let canary = try optional(.rolloutCanary, expected: "a list of user IDs") {
                try reader.requiredStringArray(forKey: ConfigKey(ConfigurationKey.rolloutCanary.rawValue))
            } ?? []
            do {
                return try RolloutPolicy(steps: try RolloutPolicy.parseSteps(stepsText), canary: canary, waitSeconds: waitSeconds, haltOn: haltOn)
            } catch {
                let key: ConfigurationKey = error.description.hasPrefix("canary") ? .rolloutCanary : error.description.hasPrefix("haltOn") ? .rolloutHaltOn : .rolloutSteps
                throw self.error(key, error.description)
            }
        }

        /// `cluster.*`: nil (one host) without `cluster.host`.
        private func clusterSettings(replica: String?) throws(ConfigurationError) -> ClusterSettings? {
            guard let host = try string(.clusterHost) else {
                if let key = firstPresent(in: "cluster") {
                    throw error(.clusterHost, "is required when \(key.rawValue) is set: this host's name in the cluster")
                }
                return nil
            }
            let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
            guard !host.isEmpty, host.count <= 63, host.allSatisfy(allowed.contains), host.first != "." else {
                throw error(.clusterHost, "must be 1-63 letters, digits, '.', '_' or '-', not starting with '.' (got \"\(host)\")")
            }
            guard let etcd = try optional(.clusterEtcd, expected: "a list of URLs", { try reader.requiredStringArray(forKey: ConfigKey(ConfigurationKey.clusterEtcd.rawValue)) }), !etcd.isEmpty else {
                throw error(.clusterEtcd, "is required: the etcd members' client URLs, e.g. [http://127.0.0.1:2379]")
            }
            for url in etcd where !(url.hasPrefix("http://") || url.hasPrefix("https://")) || url.split(separator: ":").count != 3 {
                throw error(.clusterEtcd, "every member must be an http://host:port URL (got \"\(url)\")")
            }
            guard let address = try string(.clusterAddress), HostPort(address) != nil else {
                throw error(.clusterAddress, "is required: host:port where other daemons reach this one, e.g. 10.0.0.2:7001")
            }
            guard let replica else {
                throw error(.clusterHost, "a cluster needs replication.replica (one replica all hosts reach): it is how a user's store reaches the next host that owns it")
            }
            // A restore reads the newest epoch folder that holds data, which the daemon lists
            // itself: a file:// folder or an s3:// bucket, not an sftp:// server.
            guard replica.hasPrefix("file://") || replica.hasPrefix("s3://") else {
                throw error(.clusterHost, "a cluster needs an s3:// replica (a bucket every host reaches) or a file:// one (a folder every host mounts); sftp:// is not supported with cluster.*")
            }
            var settings = ClusterSettings(host: host, etcd: etcd, address: address)
            settings.leaseSeconds = try int(.clusterLeaseSeconds, minimum: 3, maximum: 300) ?? 10
            settings.forward = try bool(.clusterForward) ?? true
            settings.forwardTimeoutMilliseconds = try int(.clusterForwardTimeoutMilliseconds, minimum: 100, maximum: 3_600_000) ?? 30_000
            if let listen = try string(.clusterListen) {
                guard HostPort(listen) != nil else { throw error(.clusterListen, "must be host:port, e.g. 0.0.0.0:7001 (got \"\(listen)\")") }
                settings.listen = listen
            }
            let tlsKeys: [ConfigurationKey] = [.clusterTLSCertificate, .clusterTLSKey, .clusterTLSCA]
            if tlsKeys.contains(where: { present.contains($0.rawValue) }) {
                var files: [String] = []
                for key in tlsKeys {
                    guard present.contains(key.rawValue) else { throw error(key, "is required with the other cluster.tls keys (PEM files: this host's certificate, its key, the cluster's CA)") }
                    let file = try path(key, default: "")
                    guard FileManager.default.isReadableFile(atPath: file) else { throw error(key, "cannot read \(file)") }
                    files.append(file)
                }
                settings.tls = ClusterTLS(certificate: files[0], key: files[1], ca: files[2])
            }
            if settings.forward && settings.tls == nil {
                throw error(.clusterForward, "forwarding to other daemons needs mutual TLS: set cluster.tls.certificate, cluster.tls.key and cluster.tls.ca (docs/cluster.md), or cluster.forward: false, and requests for users another host owns get WrongHost")
            }
            if present.contains(ConfigurationKey.clusterListen.rawValue) && settings.tls == nil {
                throw error(.clusterListen, "needs cluster.tls: other daemons reach this one only over mutual TLS")
            }
            return settings
        }

        /// `replication.*`: nil (off) without `replication.replica`.
        private func replicationSettings(dataDirectory: String) throws(ConfigurationError) -> ReplicationSettings? {
            guard let replica = try string(.replicationReplica) else {
                if let key = firstPresent(in: "replication") {
                    throw error(.replicationReplica, "is required when \(key.rawValue) is set: the replica URL (file:///... or s3://...)")
                }
                return nil
            }
            let scheme = replica.range(of: "://").map { String(replica[..<$0.lowerBound]) }
            if scheme == "sftp" {
                // Litestream wrote there; the daemon's own log needs a replica it can list and write.
                throw error(.replicationReplica, "sftp:// replicas are no longer served: Litestream, which wrote to them, is retired, and the daemon's own log writes to a file:// folder (an SFTP server mounted with sshfs, say) or an s3:// bucket (docs/replication.md) (got \"\(replica)\")")
            }
            guard let scheme, ReplicationSettings.schemes.contains(scheme), replica.count > scheme.count + 3 else {
                throw error(.replicationReplica, "must be a file:///absolute/path or s3://bucket/prefix URL (got \"\(replica)\")")
            }
            if scheme == "file", !replica.dropFirst(7).hasPrefix("/") {
                throw error(.replicationReplica, "a file:// replica needs an absolute path: file:///var/lib/userstore-replica (got \"\(replica)\")")
            }
            var settings = ReplicationSettings(replica: replica.hasSuffix("/") ? String(replica.dropLast()) : replica)
            if scheme == "s3" {
                settings.s3 = try s3Settings(replica)
                settings.replica = settings.s3!.url
            } else if let key = firstPresent(in: "replication.s3") {
                throw error(key, "is only for an s3:// replication.replica")
            }
            settings.durableWrites = try bool(.replicationDurableWrites) ?? false
            settings.durableTimeoutMilliseconds = try int(.replicationDurableTimeoutMilliseconds, minimum: 100, maximum: 600_000) ?? 10_000
            settings.litestream = try string(.replicationLitestream) ?? "litestream"
            if settings.litestream.contains("/") { settings.litestream = try path(.replicationLitestream, default: "") }
            settings.leaseSeconds = try int(.replicationLeaseSeconds, minimum: 3, maximum: 300) ?? 15
            settings.foldSeconds = try int(.replicationFoldSeconds, minimum: 0, maximum: 86_400) ?? 60
            settings.batchMilliseconds = try int(.replicationBatchMilliseconds, minimum: 0, maximum: 10_000) ?? 5
            settings.unusedKeys = try unusedLitestreamKeys()
            return settings
        }

        /// The keys of Litestream's time present in the file: still checked (a configuration that
        /// worked keeps working, a wrong value is still named) and otherwise unused.
        private func unusedLitestreamKeys() throws(ConfigurationError) -> [String] {
            // `log`, or `litestream`: retired, accepted, and the log replicates.
            if let engine = try string(.replicationEngine), engine != "log", engine != "litestream" {
                throw error(.replicationEngine, "must be log (got \"\(engine)\")")
            }
            _ = try int(.replicationSyncIntervalMilliseconds, minimum: 100, maximum: 3_600_000)
            _ = try int(.replicationMaxRegisteredStores, minimum: 1, maximum: 100_000)
            _ = try int(.replicationRestartUnresponsiveSeconds, minimum: 0, maximum: 86_400)
            _ = try bool(.replicationStartLitestream)
            _ = try string(.replicationSocket)
            if let address = try string(.replicationLitestreamMetricsAddress) {
                guard case .tcp = MetricsAddress(address) else {
                    throw error(.replicationLitestreamMetricsAddress, "must be host:port, where Litestream served /metrics (127.0.0.1:9090) (got \"\(address)\")")
                }
            }
            let unused: [ConfigurationKey] = [.replicationEngine, .replicationSyncIntervalMilliseconds, .replicationMaxRegisteredStores, .replicationSocket,
                                              .replicationStartLitestream, .replicationRestartUnresponsiveSeconds, .replicationLitestreamMetricsAddress]
            return unused.filter { present.contains($0.rawValue) && ($0 != .replicationEngine || (try? string($0)) == "litestream") }.map(\.rawValue)
        }

        /// `replication.s3.*` for the `s3://BUCKET/PREFIX[?endpoint=…&region=…&forcePathStyle=…]`
        /// replica: the section's keys win over the URL's query.
        /// An `s3://` URL's settings (`key`: the key it came from, for errors).
        private func s3Settings(_ replica: String, key: ConfigurationKey = .replicationReplica) throws(ConfigurationError) -> S3ReplicaSettings {
            let withoutScheme = replica.dropFirst(5)
            let (location, queryText) = withoutScheme.firstIndex(of: "?").map { (withoutScheme[..<$0], String(withoutScheme[withoutScheme.index(after: $0)...])) }
                ?? (withoutScheme, "")
            let parts = location.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
            let bucket = String(parts[0])
            guard !bucket.isEmpty, bucket.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_" }) else {
                throw error(key, "an s3:// URL names a bucket first: s3://BUCKET/PREFIX (got \"\(replica)\")")
            }
            var settings = S3ReplicaSettings(bucket: bucket, prefix: parts.count > 1 ? parts[1].split(separator: "/").joined(separator: "/") : "")
            var query: [String: String] = [:]
            for pair in queryText.split(separator: "&") {
                let halves = pair.split(separator: "=", maxSplits: 1)
                query[String(halves[0])] = halves.count > 1 ? String(halves[1]).removingPercentEncoding ?? String(halves[1]) : ""
            }
            settings.endpoint = try string(.replicationS3Endpoint) ?? query["endpoint"]
            if let endpoint = settings.endpoint {
                guard let url = URLComponents(string: endpoint), ["http", "https"].contains(url.scheme), url.host?.isEmpty == false,
                      url.path.isEmpty || url.path == "/" else {
                    throw error(.replicationS3Endpoint, "must be an http://host[:port] or https://host[:port] URL without a path (got \"\(endpoint)\")")
                }
                settings.endpoint = endpoint.hasSuffix("/") ? String(endpoint.dropLast()) : endpoint
            }
            settings.region = try string(.replicationS3Region) ?? query["region"] ?? "us-east-1"
            let urlPathStyle = (query["forcePathStyle"] ?? query["force-path-style"]).map { $0 == "true" || $0 == "1" }
            settings.forcePathStyle = try bool(.replicationS3ForcePathStyle) ?? urlPathStyle ?? (settings.endpoint != nil)
            if try string(.replicationS3CredentialsFile) != nil {
                let file = try path(.replicationS3CredentialsFile, default: "")
                guard FileManager.default.isReadableFile(atPath: file) else { throw error(.replicationS3CredentialsFile, "cannot read \(file)") }
                settings.credentialsFile = file
            }
            if let name = try string(.replicationS3Credential) {
                guard !name.isEmpty, !name.contains("/") else { throw error(.replicationS3Credential, "must be a systemd credential's name (LoadCredential=NAME:…), got \"\(name)\"") }
                settings.credential = name
            }
            if try string(.replicationS3CaFile) != nil {
                let file = try path(.replicationS3CaFile, default: "")
                guard FileManager.default.isReadableFile(atPath: file) else { throw error(.replicationS3CaFile, "cannot read \(file)") }
                settings.caFile = file
            }
            return settings
        }

        /// The first key of `section` (in ``ConfigurationKey``'s order) the file or the
        /// environment sets.
        func firstPresent(in section: String) -> ConfigurationKey? {
            ConfigurationKey.allCases.first { $0.rawValue.hasPrefix(section + ".") && present.contains($0.rawValue) }
        }

        func error(_ key: ConfigurationKey, _ problem: String) -> ConfigurationError {
            ConfigurationError(file: file, key: key.rawValue, problem: problem)
        }

        /// Runs `read`; nil when the key is absent, a ConfigurationError when it has the wrong type.
        func optional<T>(_ key: ConfigurationKey, expected: String, _ read: () throws -> T) throws(ConfigurationError) -> T? {
            do {
                return try read()
            } catch {
                guard present.contains(key.rawValue) else { return nil }
                throw self.error(key, "must be \(expected)")
            }
        }

        func string(_ key: ConfigurationKey) throws(ConfigurationError) -> String? {
            try optional(key, expected: "a string") { try reader.requiredString(forKey: ConfigKey(key.rawValue)) }
        }

        func bool(_ key: ConfigurationKey) throws(ConfigurationError) -> Bool? {
            try optional(key, expected: "true or false") { try reader.requiredBool(forKey: ConfigKey(key.rawValue)) }
        }

        /// `auto`, `true` (always) or `false` (never); YAML's booleans and the words both work.
        func backupMode(_ key: ConfigurationKey) throws(ConfigurationError) -> MigrationPolicy.BackupMode? {
            if let flag = try? reader.requiredBool(forKey: ConfigKey(key.rawValue)) { return flag ? .always : .never }
            guard let text = try? reader.requiredString(forKey: ConfigKey(key.rawValue)) else {
                guard present.contains(key.rawValue) else { return nil }
                throw error(key, "must be auto, true or false")
            }
            guard let mode = MigrationPolicy.BackupMode(rawValue: text.lowercased()) else {
                throw error(key, "must be auto, true or false (got \"\(text)\")")
            }
            return mode
        }

        func int(_ key: ConfigurationKey, minimum: Int, maximum: Int = Int.max) throws(ConfigurationError) -> Int? {
            guard let value = try optional(key, expected: "an integer", { try reader.requiredInt(forKey: ConfigKey(key.rawValue)) }) else { return nil }
            guard value >= minimum, value <= maximum else {
                throw error(key, maximum == Int.max ? "must be at least \(minimum) (got \(value))" : "must be between \(minimum) and \(maximum) (got \(value))")
            }
            return value
        }

        func path(_ key: ConfigurationKey, default fallback: String) throws(ConfigurationError) -> String {
            let value = try string(key) ?? fallback
            guard !value.isEmpty else { throw error(key, "must not be empty") }
            if value.hasPrefix("/") { return value }
            let base = URL(fileURLWithPath: file).deletingLastPathComponent()
            return base.appendingPathComponent(value).standardizedFileURL.path
        }

        func ids(_ key: ConfigurationKey, resolve: (String) -> UInt32?) throws(ConfigurationError) -> Set<UInt32> {
            guard let names = try optional(key, expected: "a list of names or numeric ids", { try reader.requiredStringArray(forKey: ConfigKey(key.rawValue)) }) else { return [] }
            var result = Set<UInt32>()
            for name in names {
                guard let id = resolve(name) else { throw error(key, "'\(name)' is not a known user or group on this host") }
                result.insert(id)
            }
            return result
        }
    }
}
