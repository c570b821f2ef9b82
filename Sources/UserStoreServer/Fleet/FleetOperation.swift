import UserStoreCore
import Varlink

/// Runs one operation over many stores with at most `parallel` in flight, handing each outcome
/// to `report` as it finishes (in completion order). Stops starting new stores when `report`
/// throws (the caller went away) or on cancellation; stores already started finish.
enum FleetOperation {
    static func run<Outcome: Sendable>(
        _ users: [UserID], parallel: Int,
        operation: @escaping @Sendable (UserID) async -> Outcome,
        report: (UserID, Outcome) async throws -> Void
    ) async throws {
        try await withThrowingTaskGroup(of: (UserID, Outcome).self) { group in
            var next = 0
            func startNext() {
                guard next < users.count, !Task.isCancelled else { return }
                let user = users[next]
                next += 1
                group.addTask { (user, await operation(user)) }
            }
            for _ in 0..<max(1, parallel) { startNext() }
            while let (user, outcome) = try await group.next() {
                try await report(user, outcome)
                startNext()
            }
        }
    }
}

/// Progress of a fleet operation, reported in every reply.
struct FleetProgress {
    var done = 0
    var total: Int
    var failures = 0
    var migrated = 0
    var failed: [JSONValue] = []

    var fields: [String: JSONValue] {
        ["done": .integer(Int64(done)), "total": .integer(Int64(total)), "failures": .integer(Int64(failures)), "migrated": .integer(Int64(migrated))]
    }
}
