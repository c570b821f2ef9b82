import Foundation

/// This machine's host name (`gethostname`), as a replica's marker and writer lease name it.
package enum HostName {
    package static var current: String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "localhost" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? "localhost" : name
    }
}

/// A process as the writer lease names it, so that a daemon on the same machine can tell that
/// the holder's process is gone (SIGKILLed, crashed) and take over at once instead of waiting
/// for the lease to run out: the boot's ID, the pid namespace, the pid, and the process's start
/// time (a pid reused after the holder ended has another start time).
package struct ProcessIdentity: Codable, Sendable, Equatable {
    /// `/proc/sys/kernel/random/boot_id`: the same only on this machine, until it reboots.
    package var bootID: String
    /// `/proc/self/ns/pid` (`pid:[4026531836]`): containers on one machine share the boot ID
    /// but not their pids.
    package var pidNamespace: String?
    package var pid: Int32
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot when the process started.
    package var startTicks: UInt64

    /// This process.
    package static let current: ProcessIdentity? = {
        guard let boot = bootID, let start = startTicks(of: getpid()) else { return nil }
        return ProcessIdentity(bootID: boot, pidNamespace: pidNamespace, pid: getpid(), startTicks: start)
    }()

    /// Whether this process is known to be gone: it ran on this machine since its last boot,
    /// in this pid namespace, and no process with its pid and start time exists now. False when
    /// that cannot be told (another machine, another boot, another container: it may be alive
    /// there).
    package var isGone: Bool {
        guard bootID == Self.bootID, let namespace = pidNamespace, namespace == Self.pidNamespace else { return false }
        guard let (state, start) = Self.stat(of: pid), start == startTicks else { return true }
        // Dead but not yet reaped (a zombie, its parent gone or busy): gone all the same.
        return state == "Z" || state == "X"
    }

    static var pidNamespace: String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid")
    }

    static var bootID: String? {
        (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func startTicks(of pid: Int32) -> UInt64? { stat(of: pid)?.start }

    /// The state (field 3) and start time (field 22) of `/proc/<pid>/stat`.
    static func stat(of pid: Int32) -> (state: Substring, start: UInt64)? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // After the command name (which may hold spaces and parentheses): state is field 3.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19, let start = UInt64(fields[19]) else { return nil }
        return (fields[0], start)
    }
}
