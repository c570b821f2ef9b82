import ArgumentParser
import Foundation
import UserStoreConfiguration
import UserStoreServer

/// `userstored`: per-user SQLite stores over a varlink Unix socket.
@main
struct UserStoreDaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "userstored",
        abstract: "Serve per-user SQLite stores over a varlink Unix socket.",
        discussion: """
            Keeps one SQLite file per application user ID, each behind its own serial queue, \
            migrated lazily on first use. Runs in the foreground; under systemd it uses \
            Type=notify, the watchdog and socket activation. SIGTERM/SIGINT stop it gracefully, \
            SIGHUP reloads configuration and migrations.

            Every configuration key can be overridden by an environment variable: USERSTORED_ \
            followed by the key in upper snake case (USERSTORED_DATA_DIRECTORY, \
            USERSTORED_LIMITS_MAX_CONNECTIONS). Every key is described in docs/configuration.md \
            and in the commented /etc/userstore/userstored.yaml (config/userstored.yaml).

            With replication on (a file:// or s3:// replica), the daemon copies the stores \
            itself and runs no other process: every store's commits go into one log per host \
            (<replica>/log/), a batch of stores per object; log objects older than \
            replication.foldSeconds are folded into per-user objects (<replica>/users/); a host \
            that takes the lease at a new epoch — in a cluster, a bucket — writes a fence \
            (<replica>/fences/) so that what an old owner uploads later never counts. A user \
            whose copy is only in Litestream's layout (replicated before the daemon's own log) \
            is restored from it once with `litestream restore` (replication.litestream). \
            Litestream's keys (replication.engine: litestream, syncIntervalMilliseconds, \
            maxRegisteredStores, socket, startLitestream, restartUnresponsiveSeconds, \
            litestreamMetricsAddress) are accepted and unused; an sftp:// replica is refused. An \
            s3:// replica takes its endpoint, \
            region, addressing, credentials (a file, or a systemd credential: \
            replication.s3.credential with LoadCredential=) and CA from replication.s3.*; a \
            bucket that refuses the credentials (ReplicaAccessDenied) or does not exist \
            (ReplicaBucketMissing) stops the daemon at start (exit 78), one that cannot be \
            reached (ReplicaUnreachable) leaves replication degraded until it answers. /metrics \
            shows the requests and bytes the daemon sent to the bucket.

            A file:// or s3:// replica carries a marker (userstore-replica.json) whose ID the \
            data directory records (replica.json): while the replica is empty or another one \
            where the data directory expects its own (ReplicaMissing, ReplicaMismatch), no store \
            is created or restored; another replica's marker at start exits 78. `userstorectl \
            replication init` says on purpose that a replica is new. With one host, the replica's \
            writer lease (userstore-lease.json, replication.leaseSeconds) decides which daemon \
            writes to it: one that does not hold it serves no store and takes it over once the \
            holder stops, is gone or lets it run out, or at once with `userstorectl replication \
            take-over`. See docs/replication.md.

            With an encryption section, every store is encrypted page by page (AES-256-GCM) with             its user's own data key, kept wrapped by the key-encryption key (encryption.keyFile,             or a systemd credential: encryption.credential with LoadCredentialEncrypted=) in a key             store apart from the data (encryption.keyStore: file:// or s3://). A wrong key stops             the daemon at start (exit 78, KeyEncryptionKeyWrong); a store whose key is missing is             StoreKeyMissing, one whose key DeleteStore destroyed StoreErased. See docs/encryption.md.
            """,
        version: DaemonInfo.version)

    @Option(name: .long, help: "The configuration file.")
    var config: String = "/etc/userstore/userstored.yaml"

    @Option(name: .long, help: "Where log events go: auto (journal when started by systemd, else stderr), journal or stderr. Overrides logTarget.")
    var logTarget: DaemonConfiguration.LogTarget?

    func run() async throws {
        let code = await Daemon.run(configurationPath: config, logTarget: logTarget)
        if code != .success { throw ExitCode(code.rawValue) }
    }
}

extension DaemonConfiguration.LogTarget: ExpressibleByArgument {}
