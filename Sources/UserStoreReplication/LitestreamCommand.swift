import CChildProcess
import Foundation

/// The litestream binary, run by the daemon: one-shot commands (`restore`) and the long-running
/// `replicate` child (``LitestreamProcess``).
///
/// Every run starts with `us_spawn_tied`: the kernel kills the process (SIGKILL) when the thread
/// that started it ends. The threads that start Litestream — the blocking pool's and the
/// supervisor's — end only with the daemon, so no Litestream outlives its daemon, however the
/// daemon ends (SIGKILL included; docs/replication.md "Running Litestream"). The process stays in
/// the daemon's process group and gets none of its descriptors.
package struct LitestreamCommand: Sendable {
    /// The binary's path (posix spawning needs a path, not a name to look up).
    package let executable: String
    /// Its whole environment (nothing of the daemon's is inherited: a variable such as
    /// `AWS_CA_BUNDLE` breaks Litestream's S3 client).
    package let environment: [String: String]

    /// A run that could not start, did not end in time, or could not be waited for.
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    package init(_ binary: String, environment: [String: String]) {
        executable = Self.resolve(binary)
        self.environment = environment
    }

    /// Starts `litestream arguments`, its stdout and stderr on `output` (the daemon's stderr when
    /// -1), and returns its pid. Call it from a thread that lives as long as the daemon.
    package func spawn(_ arguments: [String], output: Int32 = -1) throws(Failure) -> pid_t {
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let variables = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for pointer in variables { free(pointer) } }
        let pid = us_spawn_tied(executable, argv, variables, output)
        guard pid > 0 else { throw Failure(description: "cannot run \(executable): \(String(cString: strerror(errno)))") }
        return pid
    }

    /// Runs `litestream arguments` to its end and returns its exit status (128 + the signal when
    /// a signal ended it) and its output (stdout and stderr). A run longer than `limit` is killed.
    ///
    /// Output goes to a temporary file, not a pipe: a pipe's write end inherited by a process
    /// started at the same moment would keep the read from ending.
    package func run(_ arguments: [String], limit: Duration) throws(Failure) -> (status: Int32, output: String) {
        let outputPath = NSTemporaryDirectory() + "userstored-litestream-\(UUID().uuidString).log"
        let output = open(outputPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard output >= 0 else {
            throw Failure(description: "cannot create \(outputPath) for litestream's output: \(String(cString: strerror(errno)))")
        }
        defer {
            close(output)
            unlink(outputPath)
        }
        let pid = try spawn(arguments, output: output)
        let milliseconds = Int32(clamping: limit.components.seconds * 1000 + limit.components.attoseconds / 1_000_000_000_000_000)
        if us_wait_for_exit(pid, milliseconds) == 0 {
            kill(pid, SIGKILL)
            _ = Self.reap(pid)
            throw Failure(description: "litestream \(arguments.first ?? "") did not finish within \(limit)")
        }
        guard let status = Self.reap(pid) else {
            throw Failure(description: "waiting for litestream: \(String(cString: strerror(errno)))")
        }
        return (status, (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "")
    }

    /// Waits for child `pid` to end (blocking) and returns its exit status (128 + the signal
    /// when a signal ended it); nil when it cannot be waited for.
    package static func reap(_ pid: pid_t) -> Int32? {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            if errno != EINTR { return nil }
        }
        // WIFEXITED / WEXITSTATUS are macros: exit status in bits 8-15 when the low 7 bits are 0.
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    }

    /// Where the Debian package keeps its Litestream.
    package static let packagedFolder = "/usr/libexec/userstore"

    /// `name` found in `$PATH` or ``packagedFolder``, or `name` itself.
    package static func resolve(_ name: String) -> String {
        guard !name.contains("/") else { return name }
        // PATH, then the Debian package's private copy (docs/package.md): not on PATH, so that it
        // never shadows another package's litestream.
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for folder in path.split(separator: ":") + [Substring(packagedFolder)] {
            let candidate = "\(folder)/\(name)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return name
    }

    /// Litestream's last log lines without their timestamps: the reason it gives.
    package static func lastLines(_ output: String) -> String {
        let lines = output.split(separator: "\n").map { line -> String in
            if let message = line.range(of: "msg=") { return String(line[message.upperBound...]) }
            return String(line)
        }
        return lines.suffix(2).joined(separator: "; ")
    }

    /// Whether Litestream's failure says the replica's data is bad rather than unreachable.
    package static func isDamage(_ message: String) -> Bool {
        let lowered = message.lowercased()
        // Not "decode" alone: Litestream wraps transport errors as "decode database: …" too.
        // Format errors name what was wrong with the data (a page header, a checksum, lz4).
        return ["integrity", "checksum", "corrupt", "malformed", "decompress", "invalid ltx", "invalid page", "magic"].contains { lowered.contains($0) }
    }
}
