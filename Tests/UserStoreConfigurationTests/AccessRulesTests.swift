import Testing
import UserStoreConfiguration

/// Who may use which interface, and when the daemon looks up a peer's groups (a lookup in the
/// user and group databases, on the loop that accepts the connection).
struct AccessRulesTests {
    /// Counts the lookups a grant makes.
    final class Lookups {
        var count = 0
        let groups: [UInt32]
        init(_ groups: [UInt32]) { self.groups = groups }
        func callAsFunction() -> [UInt32] { count += 1; return groups }
    }

    @Test func noGroupRuleMeansNoLookup() {
        let rules = AccessRules(), lookups = Lookups([500])
        let grant = rules.grant(uid: 4321, gid: 100) { lookups() }
        #expect(grant == .init(store: false, admin: false, onlyStore: nil))
        #expect(lookups.count == 0)
    }

    @Test func aUserRuleOrThePrimaryGroupDecidesWithoutALookup() {
        var rules = AccessRules()
        rules.clientUsers = [4321]
        rules.clientGroups = [100]
        let lookups = Lookups([])
        #expect(rules.grant(uid: 4321, gid: 7) { lookups() }.store)
        #expect(rules.grant(uid: 9999, gid: 100) { lookups() }.store)
        // An admin rule by group still needs the lookup for a peer not in it by its primary group.
        rules.adminGroups = [600]
        #expect(!rules.grant(uid: 4321, gid: 7) { lookups() }.admin)
        #expect(lookups.count == 1)
    }

    @Test func supplementaryGroupsAreLookedUpOnceAndDecide() {
        var rules = AccessRules()
        rules.clientGroups = [500]
        rules.adminGroups = [600]
        let lookups = Lookups([100, 500])
        let grant = rules.grant(uid: 4321, gid: 100) { lookups() }
        #expect(grant == .init(store: true, admin: false, onlyStore: nil))
        #expect(lookups.count == 1)
        let admin = Lookups([100, 600])
        #expect(rules.grant(uid: 4321, gid: 100) { admin() } == .init(store: true, admin: true, onlyStore: nil))
        rules.perUnixUserStores = true
        #expect(rules.grant(uid: 4321, gid: 100) { lookups() }.onlyStore == "4321")
    }
}
