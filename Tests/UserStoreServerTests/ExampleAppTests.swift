import DaemonTestSupport
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// Examples/NotesServer, the Hummingbird app on UserStoreClient: built from its own package,
/// started against a live daemon with the repository's migrations, and driven over real HTTP.
@Suite(.serialized) struct ExampleAppTests {
    /// Builds the example (its own package, depending on this one by path) and returns its binary.
    static func buildExample() throws -> String {
        let package = repositoryRoot + "/Examples/NotesServer"
        let swift = ProcessInfo.processInfo.environment["SWIFT_EXEC_PATH"] ?? "/opt/swift/usr/bin/swift"
        var build = try run([swift, "build", "--package-path", package])
        if build.status != 0 {
            // SwiftPM keeps a path dependency's file list in the example's build description and
            // fails ("missing inputs") once a file of this package was removed or renamed: a
            // clean build of the example (its own .build only) gets past it.
            _ = try run([swift, "package", "--package-path", package, "clean"])
            build = try run([swift, "build", "--package-path", package])
        }
        guard build.status == 0 else {
            Issue.record("the example did not build:\n\(build.stdout.suffix(4000))\n\(build.stderr.suffix(4000))")
            throw CocoaError(.executableLoad)
        }
        let path = try run([swift, "build", "--package-path", package, "--show-bin-path"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        return path + "/NotesServer"
    }

    struct Note: Codable, Equatable {
        let id: Int64
        let title: String
        let body: String
        let pinned: Bool
    }

    /// One HTTP request; returns the status and body.
    func request(_ method: String, _ url: URL, user: String?, json: String? = nil) async throws -> (Int, Data) {
        var request = URLRequest(url: url)
        request.httpMethod = method
        if let user { request.setValue(user, forHTTPHeaderField: "X-User") }
        if let json {
            request.httpBody = Data(json.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        return ((response as! HTTPURLResponse).statusCode, data)
    }

    /// The last `id:` line's position in Server-Sent Events text.
    static func lastID(in text: String) -> Int64? {
        // By Unicode scalars: chunked encoding's "\r\n" is one Character, which would glue the
        // chunk's size to the line after it.
        let lines = text.unicodeScalars.split(separator: "\n").map { String(String.UnicodeScalarView($0)).trimmingCharacters(in: .whitespacesAndNewlines) }
        return lines.last { $0.hasPrefix("id: ") }.flatMap { Int64($0.dropFirst(4)) }
    }

    /// A `GET /notes/events` read over a plain socket, a chunk at a time (10 s at most per read).
    final class EventStream {
        let descriptor: Int32
        var received = ""

        init(port: Int, user: String, lastEventID: Int64? = nil) throws {
            descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else { throw POSIXError(.ECONNREFUSED) }
            var timeout = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var head = "GET /notes/events HTTP/1.1\r\nHost: 127.0.0.1\r\nX-User: \(user)\r\nAccept: text/event-stream\r\n"
            if let lastEventID { head += "Last-Event-ID: \(lastEventID)\r\n" }
            head += "\r\n"
            _ = head.withCString { send(descriptor, $0, strlen($0), 0) }
        }

        deinit { close(descriptor) }

        /// What arrived up to and including `marker` (after `start`, if given); throws when
        /// nothing more comes within the time-out.
        func read(until marker: String, after start: String? = nil) throws -> String {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                if let start, let from = received.range(of: start), let end = received.range(of: marker, range: from.upperBound..<received.endIndex) {
                    let found = String(received[..<end.upperBound])
                    received.removeSubrange(..<end.upperBound)
                    return found
                }
                if start == nil, let end = received.range(of: marker) {
                    let found = String(received[..<end.upperBound])
                    received.removeSubrange(..<end.upperBound)
                    return found
                }
                let count = recv(descriptor, &buffer, buffer.count, 0)
                guard count > 0 else { throw POSIXError(.ETIMEDOUT) }
                received += String(decoding: buffer[..<count], as: UTF8.self)
            }
        }
    }

    /// Runs blocking `body` on a thread of its own, not on the cooperative pool (two threads
    /// here), which a minute-long build would take from every other suite running in parallel.
    static func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try body() }) }.start()
        }
    }

    @Test(.timeLimit(.minutes(10)))
    func theNotesAppServesEachUserTheirOwnNotesOverHTTP() async throws {
        let binary = try await Self.offPool { try Self.buildExample() }
        let daemon = try DaemonHarness()
        try daemon.start()
        let app = Process()
        app.executableURL = URL(fileURLWithPath: binary)
        app.environment = ["USERSTORE_SOCKET": daemon.socketPath, "NOTES_PORT": "0", "PATH": "/usr/bin:/bin"]
        let output = Pipe()
        app.standardOutput = output
        app.standardError = FileHandle.nullDevice
        try app.run()
        defer { app.terminate(); app.waitUntilExit() }
        // The app prints the address it bound once it serves.
        let reader = output.fileHandleForReading
        let printed = try await Self.offPool {
            var printed = ""
            while !printed.contains("\n") {
                let chunk = reader.availableData
                guard !chunk.isEmpty else { break }
                printed += String(decoding: chunk, as: UTF8.self)
            }
            return printed
        }
        let port = try #require(printed.split(separator: ":").last.flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) },
                                "the app printed no address: \(printed)")
        let base = URL(string: "http://127.0.0.1:\(port)/notes")!
        let decoder = JSONDecoder()

        let (created, createdBody) = try await request("POST", base, user: "alice", json: #"{"title": "first", "body": "hello"}"#)
        #expect(created == 201)
        let first = try decoder.decode(Note.self, from: createdBody)
        #expect(first.title == "first" && first.body == "hello" && !first.pinned)
        _ = try await request("POST", base, user: "alice", json: #"{"title": "second", "pinned": true}"#)
        _ = try await request("POST", base, user: "bob", json: #"{"title": "bob's"}"#)

        let (listed, listBody) = try await request("GET", base, user: "alice")
        #expect(listed == 200)
        #expect(try decoder.decode([Note].self, from: listBody).map(\.title) == ["second", "first"])
        let (_, bobBody) = try await request("GET", base, user: "bob")
        #expect(try decoder.decode([Note].self, from: bobBody).map(\.title) == ["bob's"])

        let (counted, countBody) = try await request("GET", base.appendingPathComponent("count"), user: "alice")
        #expect(counted == 200)
        #expect(try decoder.decode([String: Int64].self, from: countBody) == ["notes": 2, "pinned": 1])

        let one = base.appendingPathComponent(String(first.id))
        let (patched, patchedBody) = try await request("PATCH", one, user: "alice", json: #"{"title": "renamed"}"#)
        #expect(patched == 200)
        #expect(try decoder.decode(Note.self, from: patchedBody).title == "renamed")
        // The 2.0 migration's CHECK: a title over 200 characters is a conflict, not a crash.
        let (tooLong, _) = try await request("PATCH", one, user: "alice", json: "{\"title\": \"\(String(repeating: "x", count: 201))\"}")
        #expect(tooLong == 409)
        #expect(try await request("DELETE", one, user: "alice").0 == 204)
        #expect(try await request("GET", one, user: "alice").0 == 404)
        #expect(try await request("DELETE", one, user: "alice").0 == 404)
        // Who the caller is matters: no header, or a user ID the daemon refuses, is a 400.
        #expect(try await request("GET", base, user: nil).0 == 400)
        #expect(try await request("GET", base, user: "../etc").0 == 400)

        // Server-Sent Events: a stream opened, a note written through the REST API from another
        // connection, and the stream carries it; reconnecting with Last-Event-ID resumes after it.
        let events = try EventStream(port: port, user: "carol")
        let ready = try events.read(until: "event: ready")
        let start = try #require(Self.lastID(in: ready))
        _ = try await request("POST", base, user: "carol", json: #"{"title": "streamed"}"#)
        let change = try events.read(until: "\n\n", after: "event: changes")
        #expect(change.contains("\"title\":\"streamed\"") && change.contains("\"operation\":\"insert\""), "\(change)")
        #expect(Self.lastID(in: change) == start + 1)
        _ = try await request("POST", base, user: "carol", json: #"{"title": "while away"}"#)
        let resumed = try EventStream(port: port, user: "carol", lastEventID: start + 1)
        let missed = try resumed.read(until: "\n\n", after: "event: changes")
        #expect(missed.contains("while away") && !missed.contains("\"streamed\""), "\(missed)")

        // The daemon going away is a 503 for the app's callers; back, the app serves again.
        daemon.stop()
        #expect(try await request("GET", base, user: "alice").0 == 503)
        try daemon.start()
        var recovered = 0
        for _ in 0..<200 where recovered != 200 {
            recovered = try await request("GET", base, user: "alice").0
            if recovered != 200 { try await Task.sleep(for: .milliseconds(50)) } // the client's reconnect back-off
        }
        #expect(recovered == 200)
    }
}
