import Testing
@testable import UserStoreServer

/// `Top`'s sketch of the busiest users (Space-Saving, ``Activity/Window``) with many more users
/// than it holds.
struct ActivitySketchTests {
    /// A skewed stream of 50,000 calls over 1,003 users: each user not in the full sketch takes
    /// the place of a least counted one; afterwards the sketch counts every call once, no user
    /// under its true count nor over it by more than its error, and it holds every user with
    /// more than 1/64 of the calls.
    @Test func theSketchKeepsTheBusiestUsersAndReplacesALeastCountedOne() {
        var window = Activity.Window()
        var exact: [String: Int] = [:]
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        var replacedOthers = 0, replacements = 0
        let total = 50_000
        for _ in 0..<total {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let draw = Int(state >> 33)
            let user = draw % 4 == 0 ? "hot\(draw % 3)" : "u\(draw % 1000)"
            let replacing = window.users.count == Activity.sketchSize && window.positions[user] == nil
            let leastCalls = window.users.map(\.calls).min() ?? 0
            window.record(method: "io.userstore.Store.Query", user: user, nanoseconds: 1_000, bytes: 10, bucket: 0)
            exact[user, default: 0] += 1
            if replacing {
                replacements += 1
                // The new entry carries over the count of the entry it replaced.
                if window.users[window.positions[user]!].error != leastCalls { replacedOthers += 1 }
            }
        }
        #expect(replacements > 10_000, "the stream did not overflow the sketch")
        #expect(replacedOthers == 0, "\(replacedOthers) of \(replacements) new users replaced an entry that was not a least counted one")
        #expect(window.users.reduce(0) { $0 + $1.calls } == total)
        for entry in window.users {
            let count = exact[entry.user] ?? 0
            #expect(entry.calls - entry.error <= count && count <= entry.calls, "\(entry.user): \(count) calls, sketch \(entry.calls) (error \(entry.error))")
        }
        for (user, count) in exact where count > total / Activity.sketchSize {
            #expect(window.positions[user] != nil, "\(user) made \(count) of \(total) calls and is not in the sketch")
        }
        #expect(Set(window.positions.keys) == Set(window.users.map(\.user)))
    }
}
