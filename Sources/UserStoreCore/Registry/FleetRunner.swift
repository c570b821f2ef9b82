/// Runs one operation over many stores with at most `parallel` in flight, handing each outcome
/// to `report` as it finishes (in completion order). Starts no new store once `report` throws
/// (the caller went away), the task is cancelled, or `stop` says so; stores already started
/// finish (or roll back). Used by the daemon's Migrate/Verify and by `userstorectl --offline`.
public enum FleetRunner {
    public static func run<Outcome: Sendable>(
        _ users: [UserID], parallel: Int, stop: @escaping @Sendable () -> Bool = { false },
        operation: @escaping @Sendable (UserID) async -> Outcome,
        report: (UserID, Outcome) async throws -> Void
    ) async throws {
        try await withThrowingTaskGroup(of: (UserID, Outcome).self) { group in
            var next = 0
            func startNext() {
                guard next < users.count, !Task.isCancelled, !stop() else { return }
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
