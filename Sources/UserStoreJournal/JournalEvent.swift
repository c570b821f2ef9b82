/// Every kind of event userstored writes to the journal, each with its own `MESSAGE_ID` and an
/// entry in `systemd/userstored.catalog` (what happened, why, what to do). The metadata key
/// `event` of a log call names the kind.
public enum JournalEvent: String, CaseIterable, Sendable {
    case daemonStarting = "daemon-starting"
    case daemonReady = "daemon-ready"
    case daemonReloading = "daemon-reloading"
    case daemonReloaded = "daemon-reloaded"
    case daemonStopping = "daemon-stopping"
    case daemonStopped = "daemon-stopped"
    case daemonFailed = "daemon-failed"
    case storeCreated = "store-created"
    case migrationStarted = "migration-started"
    case migrationStep = "migration-step"
    case migrationFinished = "migration-finished"
    case migrationFailed = "migration-failed"
    case storeRefused = "store-refused"
    case fleetProgress = "fleet-progress"
    case slowRequest = "slow-request"
    case backupCreated = "backup-created"
    case rollbackStep = "rollback-step"
    case logEntriesDropped = "log-entries-dropped"
    case storeDeleted = "store-deleted"
    case storeExported = "store-exported"
    case storeImported = "store-imported"
    case storeRestored = "store-restored"
    case transactionExpired = "transaction-expired"

    /// The 128-bit `MESSAGE_ID` (32 lowercase hex digits), fixed forever for this kind.
    public var messageID: String {
        switch self {
        case .daemonStarting: return "22f572a07d0348b6abb54220ffe59a25"
        case .daemonReady: return "685b57f873c24a698cc6ed53e7f8c489"
        case .daemonReloading: return "6de3279a67ae40eaa6955f8152ac0cf1"
        case .daemonReloaded: return "45b4673f284849bca482964ade47e356"
        case .daemonStopping: return "0f30562931c54c55a90988cbb6e81dce"
        case .daemonStopped: return "a32a0f01956c4ccc971b923bf35946c3"
        case .daemonFailed: return "578630b7c5f54af3ae5a192870af210b"
        case .storeCreated: return "bfdbf5023fc048c897209a95b924c050"
        case .migrationStarted: return "a483cb3edb7345228f38c4b3a2b371bc"
        case .migrationStep: return "f5758f67da3c4e729b85971efc913007"
        case .migrationFinished: return "180220a202c744eaa0f767646a141c18"
        case .migrationFailed: return "03df58bce45d4961a86af821aed2b030"
        case .storeRefused: return "0fcb1c39cdd048819ae94459a636e0a8"
        case .fleetProgress: return "0527934cabf44dd9b27457a1dfe516c4"
        case .slowRequest: return "4b815400333540089e707d353fefb02e"
        case .backupCreated: return "d4fc1eb900974116bb02f3f6448e2bfa"
        case .rollbackStep: return "bff55c34b7384819b3a37a1ca7ba61d2"
        case .logEntriesDropped: return "435beae6a69248f58fd8e37d3223dd37"
        case .storeDeleted: return "8f0b5e2c6d1a4f3e9b7c2a1d0e4f6a83"
        case .storeExported: return "2c7e9a41b5d34f08a6e1c3b7d9f2a504"
        case .storeImported: return "d61a3f8e27c94b5f8e0a4c6b2d7f9e15"
        case .storeRestored: return "5a9c1e7f3b2d4e6a8c0f1b3d5e7a9c26"
        case .transactionExpired: return "7e3b9d1f5a2c4e8b9d0f2a4c6e8b1d37"
        }
    }
}
