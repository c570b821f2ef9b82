import UserStoreCore
import Varlink

/// The per-store fields of io.userstore.Admin's Migrate and Verify replies, shared by the
/// daemon (which sends them) and `userstorectl --offline` (which prints the same thing).
extension FleetOutcome {
    public var replyFields: [String: JSONValue] {
        var fields: [String: JSONValue] = ["user": .string(user.rawValue), "state": .string(state.rawValue)]
        if let fromVersion { fields["fromVersion"] = .integer(fromVersion) }
        if let toVersion { fields["toVersion"] = .integer(toVersion) }
        if let error {
            fields["error"] = .string(error.description)
            fields["errorName"] = .string(error.varlinkError.name)
        }
        return fields
    }
}

extension VerificationReport {
    public var replyFields: [String: JSONValue] {
        ["user": .string(user), "ok": .bool(ok), "schemaVersion": .integer(schemaVersion),
         "pending": .array(pending.map { .integer($0) }), "problems": .array(problems.map { .string($0) })]
    }
}
