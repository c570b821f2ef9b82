/// Every key `userstored.yaml` may hold (and its `USERSTORED_…` environment override): the one
/// list of them. The loader refuses a key not listed (a typo), the reader reads values by these
/// cases, and docs/configuration.md documents each (`ConfigurationKeyTests` checks it does).
public enum ConfigurationKey: String, CaseIterable, Sendable {
    case appVersion
    case dataDirectory
    case socketPath
    case socketMode
    case socketGroup
    case migrationsDirectory
    case schemaFile
    case maxOpenStores
    case idleTimeoutSeconds
    case cacheIdleSeconds
    case logTarget
    case slowRequestMilliseconds
    case fleetParallelism
    case migrationsAllowOutOfOrder = "migrations.allowOutOfOrder"
    case migrationsChecksumMismatch = "migrations.checksumMismatch"
    case migrationsOnFailure = "migrations.onFailure"
    case migrationsBackupBeforeMigrating = "migrations.backupBeforeMigrating"
    case migrationsBackupRetentionSeconds = "migrations.backupRetentionSeconds"
    case migrationsAllowDestructiveSchemaChanges = "migrations.allowDestructiveSchemaChanges"
    case migrationsNewStoresFromTemplate = "migrations.newStoresFromTemplate"
    case migrationsFleetSyncMethod = "migrations.fleetSyncMethod"
    case rolloutSteps = "rollout.steps"
    case rolloutCanary = "rollout.canary"
    case rolloutWait = "rollout.wait"
    case rolloutHaltOn = "rollout.haltOn"
    case watchEnabled = "watch.enabled"
    case watchKeepChanges = "watch.keepChanges"
    case watchKeepSeconds = "watch.keepSeconds"
    case watchMaxBufferedBytes = "watch.maxBufferedBytes"
    case accessClientUsers = "access.clientUsers"
    case accessClientGroups = "access.clientGroups"
    case accessAdminUsers = "access.adminUsers"
    case accessAdminGroups = "access.adminGroups"
    case accessPerUnixUserStores = "access.perUnixUserStores"
    case limitsMaxRequestBytes = "limits.maxRequestBytes"
    case limitsMaxResponseBytes = "limits.maxResponseBytes"
    case limitsStatementTimeoutMilliseconds = "limits.statementTimeoutMilliseconds"
    case limitsMaxBatchStatements = "limits.maxBatchStatements"
    case limitsMaxConnections = "limits.maxConnections"
    case limitsMaxJSONDepth = "limits.maxJSONDepth"
    case limitsTransactionIdleMilliseconds = "limits.transactionIdleMilliseconds"
    case limitsTransactionMilliseconds = "limits.transactionMilliseconds"
    case limitsRequestReadSeconds = "limits.requestReadSeconds"
    case limitsIdleConnectionSeconds = "limits.idleConnectionSeconds"
    case limitsMaxConnectionsPerUser = "limits.maxConnectionsPerUser"
    case metricsListen = "metrics.listen"
    case replicationReplica = "replication.replica"
    case replicationSyncIntervalMilliseconds = "replication.syncIntervalMilliseconds"
    case replicationMaxRegisteredStores = "replication.maxRegisteredStores"
    case replicationDurableWrites = "replication.durableWrites"
    case replicationDurableTimeoutMilliseconds = "replication.durableTimeoutMilliseconds"
    case replicationSocket = "replication.socket"
    case replicationLitestream = "replication.litestream"
    case replicationStartLitestream = "replication.startLitestream"
    case replicationRestartUnresponsiveSeconds = "replication.restartUnresponsiveSeconds"
    case replicationLeaseSeconds = "replication.leaseSeconds"
    case replicationEngine = "replication.engine"
    case replicationFoldSeconds = "replication.foldSeconds"
    case replicationBatchMilliseconds = "replication.batchMilliseconds"
    case replicationLitestreamMetricsAddress = "replication.litestreamMetricsAddress"
    case replicationS3Endpoint = "replication.s3.endpoint"
    case replicationS3Region = "replication.s3.region"
    case replicationS3ForcePathStyle = "replication.s3.forcePathStyle"
    case replicationS3CredentialsFile = "replication.s3.credentialsFile"
    case replicationS3Credential = "replication.s3.credential"
    case replicationS3CaFile = "replication.s3.caFile"
    case encryptionKeyFile = "encryption.keyFile"
    case encryptionCredential = "encryption.credential"
    case encryptionKeyStore = "encryption.keyStore"
    case clusterHost = "cluster.host"
    case clusterEtcd = "cluster.etcd"
    case clusterAddress = "cluster.address"
    case clusterLeaseSeconds = "cluster.leaseSeconds"
    case clusterForward = "cluster.forward"
    case clusterListen = "cluster.listen"
    case clusterForwardTimeoutMilliseconds = "cluster.forwardTimeoutMilliseconds"
    case clusterTLSCertificate = "cluster.tls.certificate"
    case clusterTLSKey = "cluster.tls.key"
    case clusterTLSCA = "cluster.tls.ca"

    /// The mappings keys sit in (`migrations`, `replication.s3`, …), from the keys themselves.
    static let sections: Set<String> = Set(allCases.flatMap { key in
        let parts = key.rawValue.split(separator: ".")
        return (1..<max(parts.count, 1)).map { parts[..<$0].joined(separator: ".") }
    })
}
