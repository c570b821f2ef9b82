import DaemonTestSupport
import Foundation
import Testing
@testable import UserStoreReplication

/// The daemon's client of Litestream's control socket (AsyncHTTPClient over `http+unix`,
/// Codable bodies) against a real Litestream 0.5.17, and against sockets that refuse or never
/// answer: what each call returns, and which failures count as never delivered (the WAL rule
/// relies on that: a registration that never reached Litestream holds no WAL position).
@Suite(.serialized) struct LitestreamControlTests {
    /// A `litestream replicate` serving only its control socket in `folder`, and a client of it.
    static func litestream(in folder: String) throws -> (Process, LitestreamControl) {
        let socket = folder + "/litestream.sock"
        try "socket:\n  enabled: true\n  path: \"\(socket)\"\n  permissions: 0600\n".write(toFile: folder + "/litestream.yml", atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: litestreamPath)
        process.arguments = ["replicate", "-config", folder + "/litestream.yml"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        return (process, LitestreamControl(socketPath: socket))
    }

    /// Waits (at most 60 s: the other suites, running at once, can starve this task of the two
    /// cooperative threads for a while) until `control` answers `/info`.
    static func answering(_ control: LitestreamControl) async throws -> LitestreamControl.Instance {
        let deadline = ContinuousClock.now + .seconds(60)
        while true {
            do { return try await control.info() } catch where ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20)) // Litestream is still starting
            }
        }
    }

    /// A Unix stream socket bound to `path` (not listening).
    static func boundSocket(_ path: String) throws -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            buffer.copyBytes(from: path.utf8.prefix(buffer.count - 1))
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard descriptor >= 0, bound == 0 else { throw POSIXError(.EADDRINUSE) }
        return descriptor
    }

    /// Stops process `pid` (SIGSTOP) and returns once the kernel shows it stopped (state `T` in
    /// `/proc/<pid>/stat`; at most 10 s): the signal alone returns before the stop.
    static func pause(_ pid: Int32) throws {
        kill(pid, SIGSTOP)
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
            // The state follows the command name, which is in parentheses.
            if let end = stat.lastIndex(of: ")"), stat[stat.index(after: end)...].trimmingCharacters(in: .whitespaces).hasPrefix("T") { return }
        }
        throw POSIXError(.ETIMEDOUT)
    }

    @Test func registerSyncListAndUnregisterARealStore() async throws {
        let folder = try TemporaryDirectory()
        let (process, control) = try Self.litestream(in: folder.path)
        defer { process.terminate(); process.waitUntilExit() }
        let instance = try await Self.answering(control)
        #expect(instance.pid == process.processIdentifier)
        #expect(instance.version.contains("0.5"), "\(instance)")
        #expect(!instance.startedAt.isEmpty)

        let store = folder.path + "/ann.sqlite"
        _ = try sqlite3(store, "PRAGMA journal_mode=WAL; CREATE TABLE notes (title TEXT);")
        try await control.register(store, replicaURL: "file://" + folder.path + "/replica")
        _ = try sqlite3(store, "INSERT INTO notes VALUES ('first');")
        let reply = try await control.syncAndWait(store, until: .now + .seconds(10))
        #expect(reply.isReplicated && reply.replicatedTXID >= 1, "\(reply)")
        let listed = try await control.list()
        #expect(listed.contains { $0.path == store && $0.lastSyncAt != nil }, "\(listed)")

        // The blocking forms, from a thread that is not an event loop.
        let blocking = await Task.detached {
            try control.unregister(store, until: .now + .seconds(10))
            return try control.syncAndWait(store, until: .now + .seconds(5))
        }.result
        guard case .failure(let error as LitestreamControl.Failure) = blocking else {
            Issue.record("a sync of an unregistered store succeeded: \(blocking)")
            return
        }
        // Litestream's own error, by route, and delivered (it answered).
        #expect(error.description.hasPrefix("Litestream /sync:") && error.delivered, "\(error)")
        #expect(try await control.list().allSatisfy { $0.path != store })
    }

    @Test func aMissingOrRefusingSocketIsNeverDelivered() async throws {
        let folder = try TemporaryDirectory()
        let missing = LitestreamControl(socketPath: folder.path + "/nothing.sock")
        await #expect { try await missing.info() } throws: { ($0 as? LitestreamControl.Failure)?.delivered == false }
        // A socket file nobody listens on: ECONNREFUSED.
        let path = folder.path + "/refusing.sock"
        let descriptor = try Self.boundSocket(path)
        defer { close(descriptor) }
        let refusing = LitestreamControl(socketPath: path)
        await #expect { try await refusing.register("/x.sqlite", replicaURL: "file:///y") } throws: {
            ($0 as? LitestreamControl.Failure)?.delivered == false
        }
    }

    /// A call to a socket that accepts and never answers ends at its deadline, as delivered (it
    /// may have reached a Litestream that hangs). Without a deadline it would hang: the time
    /// limit is a hang catcher, far above any starvation.
    @Test(.timeLimit(.minutes(10))) func aSocketThatNeverAnswersFailsAtTheDeadline() async throws {
        let folder = try TemporaryDirectory()
        let path = folder.path + "/silent.sock"
        let descriptor = try Self.boundSocket(path)
        defer { close(descriptor) }
        #expect(listen(descriptor, 16) == 0) // connections accepted by the kernel, never read
        let silent = LitestreamControl(socketPath: path)
        let started = ContinuousClock.now
        await #expect { try await silent.syncAndWait("/x.sqlite", until: .now + .milliseconds(500)) } throws: { error in
            let failure = error as? LitestreamControl.Failure
            return failure?.delivered == true && failure?.description.contains("did not answer /sync") == true
        }
        // Not before the deadline. How soon after it is not asserted here: the suites running at
        // once can starve this task's two cooperative threads for seconds (CI saw 21 s); the
        // daemon's durable time-out is held to 10 % by DurabilityTests.theDurableTimeOutBoundsTheWholeCall.
        #expect(ContinuousClock.now - started >= .milliseconds(450))
    }

    /// A request Litestream has not answered keeps its database's turn (``DatabaseRequests``):
    /// with Litestream paused, an unregistration the daemon gave up on is still in flight, so a
    /// registration of the same file is not sent at all — a paused Litestream that read both
    /// later would open the file again while still closing it, and the two would write the same
    /// LTX files. Another database's request is sent. Once Litestream answers, the next request
    /// goes out after the one it waited for: the file ends registered.
    @Test(.timeLimit(.minutes(10))) func anUnansweredRequestKeepsItsDatabasesTurn() async throws {
        let folder = try TemporaryDirectory()
        let (process, control) = try Self.litestream(in: folder.path)
        defer { kill(process.processIdentifier, SIGCONT); process.terminate(); process.waitUntilExit() }
        _ = try await Self.answering(control)
        let store = folder.path + "/ann.sqlite", other = folder.path + "/bob.sqlite"
        for path in [store, other] { _ = try sqlite3(path, "PRAGMA journal_mode=WAL; CREATE TABLE notes (title TEXT);") }
        try await control.register(store, replicaURL: "file://" + folder.path + "/replica/ann")

        try Self.pause(process.processIdentifier)
        await #expect { try await control.unregister(store, until: .now + .milliseconds(300)) } throws: {
            "\($0)".contains("did not answer /unregister")
        }
        await #expect { try await control.register(store, replicaURL: "file://" + folder.path + "/replica/ann", until: .now + .milliseconds(300)) } throws: { error in
            let failure = error as? LitestreamControl.Failure
            return failure?.delivered == true && failure?.description.contains("not sent") == true
        }
        await #expect { try await control.register(other, replicaURL: "file://" + folder.path + "/replica/bob", until: .now + .milliseconds(300)) } throws: {
            "\($0)".contains("did not answer /register")
        }
        #expect(LitestreamControl.requests.busy >= 2, "both requests Litestream has not answered keep their turns")

        kill(process.processIdentifier, SIGCONT)
        try await control.register(store, replicaURL: "file://" + folder.path + "/replica/ann")
        let listed = try await control.list().map(\.path)
        #expect(listed.contains(store), "the registration went out before the unregistration it waited for: \(listed)")
    }
}
