extension Array where Element: Sendable {
    /// Runs `body` for each element, at most `width` at a time, and returns once every one has;
    /// throws the first error (elements not begun by then are not, those under way are
    /// cancelled). For requests to the replica, which would otherwise wait for each other.
    package func concurrentForEach(width: Int, _ body: @escaping @Sendable (Element) async throws -> Void) async throws {
        precondition(width > 0, "concurrentForEach needs a width of at least 1")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, element) in enumerated() {
                // Past the first `width`, each begins once one under way has ended.
                if index >= width { try await group.next() }
                group.addTask { try await body(element) }
            }
            // Those still under way: their errors too (a group awaits them anyway, but drops them).
            try await group.waitForAll()
        }
    }
}
