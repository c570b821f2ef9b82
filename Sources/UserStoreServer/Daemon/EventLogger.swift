import Logging
import UserStoreCore

/// Turns store events into log entries with structured metadata. In the journal each metadata
/// key becomes a `USERSTORE_` field (`user` → `USERSTORE_USER`) and `event` selects the
/// entry's `MESSAGE_ID`. Never logs SQL parameters or row contents.
struct EventLogger: StoreObserver {
    let logger: Logger

    func record(_ event: StoreEvent) {
        if case .storeOpened = event { return }
        if case .storeClosed = event { return }
        var metadata: Logger.Metadata = ["user": .string(event.user.rawValue)]
        let level: Logger.Level
        let message: String
        switch event {
        case .storeCreated(_, let path, let templateVersion):
            metadata["event"] = "store-created"
            metadata["path"] = .string(path)
            if let templateVersion {
                (level, message) = (.info, "store created from the template at schema version \(templateVersion)")
                metadata["to_version"] = "\(templateVersion)"
            } else {
                (level, message) = (.info, "store created")
            }
        case .migrationStarted(_, let from, let to, let steps, let backup):
            (level, message) = (.info, "migrating store from version \(from) to \(to) (\(steps) step\(steps == 1 ? "" : "s"))"
                + (backup.map { $0.copy ? ", copied first: \($0.reason)" : ", no copy: \($0.reason)" } ?? ""))
            metadata["event"] = "migration-started"
            if let backup {
                metadata["backup"] = backup.copy ? "copy" : "none"
                metadata["backup_reason"] = .string(backup.reason)
            }
            metadata["from_version"] = "\(from)"
            metadata["to_version"] = "\(to)"
            metadata["steps"] = "\(steps)"
        case .migrationStep(_, let version, let migration, let step, let steps, let duration, let skipped):
            (level, message) = (.info, "applied migration \(migration) (\(step)/\(steps))\(skipped ? ", SQL skipped by app-version gating" : "")")
            metadata["event"] = "migration-step"
            metadata["version"] = "\(version)"
            metadata["migration"] = .string(migration)
            metadata["step"] = "\(step)"
            metadata["steps"] = "\(steps)"
            metadata["duration_usec"] = "\(duration)"
            metadata["skipped"] = "\(skipped)"
        case .migrationFinished(_, let from, let to, let steps, let duration):
            (level, message) = (.notice, "store migrated from version \(from) to \(to) in \(steps) step\(steps == 1 ? "" : "s")")
            metadata["event"] = "migration-finished"
            metadata["from_version"] = "\(from)"
            metadata["to_version"] = "\(to)"
            metadata["steps"] = "\(steps)"
            metadata["duration_usec"] = "\(duration)"
        case .migrationFailed(_, let error):
            (level, message) = (.error, error.description)
            metadata["event"] = "migration-failed"
            if case .migrationFailed(_, let version, let migration, let sqliteMessage, let code, let schemaVersion) = error {
                metadata["version"] = "\(version)"
                metadata["migration"] = .string(migration)
                metadata["sqlite_message"] = .string(sqliteMessage)
                if let code { metadata["sqlite_code"] = "\(code)" }
                metadata["schema_version"] = "\(schemaVersion)"
            }
        case .storeRefused(_, let error):
            (level, message) = (.error, error.description)
            metadata["event"] = "store-refused"
            metadata["reason"] = .string(Self.reason(error))
        case .backupCreated(_, let path, let version, let reason):
            (level, message) = (.info, reason == .beforeMigration ? "copy of the store taken before migrating" : "copy of the store taken (\(reason.rawValue))")
            metadata["reason"] = .string(reason.rawValue)
            metadata["event"] = "backup-created"
            metadata["path"] = .string(path)
            metadata["schema_version"] = "\(version)"
        case .rollbackStep(_, let version, let migration, let duration):
            (level, message) = (.notice, "rolled back migration \(migration)")
            metadata["event"] = "rollback-step"
            metadata["version"] = "\(version)"
            metadata["migration"] = .string(migration)
            metadata["duration_usec"] = "\(duration)"
        case .unknownAppliedMigration(_, let version, let name):
            (level, message) = (.warning, "migration \(version) (\(name)) is applied to the store but its file is gone")
            metadata["event"] = "unknown-migration"
            metadata["version"] = "\(version)"
        case .storeOpened, .storeClosed:
            return
        case .storeDeleted(_, let removed, let keptBackups):
            (level, message) = (.notice, "store deleted: \(removed) file\(removed == 1 ? "" : "s") removed\(keptBackups ? ", backups kept" : "")")
            metadata["event"] = "store-deleted"
            metadata["removed_files"] = "\(removed)"
            metadata["kept_backups"] = "\(keptBackups)"
        case .storeImported(_, let version, let replaced, let duration):
            (level, message) = (.notice, "store imported at schema version \(version)\(replaced ? ", replacing the previous store" : "")")
            metadata["event"] = "store-imported"
            metadata["schema_version"] = "\(version)"
            metadata["replaced"] = "\(replaced)"
            metadata["duration_usec"] = "\(duration)"
        case .storeSuperseded(_, let aside, let epoch):
            (level, message) = (.notice, "store set aside at \(aside): the replica has a newer copy, of epoch \(epoch), written by the host that owned the store since")
            metadata["event"] = "store-superseded"
            metadata["path"] = .string(aside)
            metadata["epoch"] = "\(epoch)"
        case .storeRestored(_, let source, let version, let duration):
            (level, message) = (.notice, "store restored from \(source) at schema version \(version)")
            metadata["event"] = "store-restored"
            metadata["source"] = .string(source)
            metadata["schema_version"] = "\(version)"
            metadata["duration_usec"] = "\(duration)"
        }
        logger.log(level: level, "\(message)", metadata: metadata)
    }

    static func reason(_ error: StoreError) -> String {
        switch error {
        case .storeTooNew: return "too-new"
        case .checksumMismatch: return "checksum-changed"
        case .outOfOrderMigration: return "out-of-order"
        case .storeDamaged: return "damaged"
        default: return "unavailable"
        }
    }
}

/// Hands each event to several observers.
struct ObserverFanOut: StoreObserver {
    let observers: [any StoreObserver]

    func record(_ event: StoreEvent) {
        for observer in observers { observer.record(event) }
    }
}
