import Foundation

/// Where userstorectl looks for the daemon when neither `--socket` nor `$USERSTORE_SOCKET` says:
/// a development daemon of a checkout first (`scripts/run.sh` serves `<checkout>/.run/userstore.sock`),
/// found from the current directory upwards and from the userstorectl binary's own folder
/// upwards (`<checkout>/.build/debug/userstorectl`), then the installed daemon's
/// `/run/userstore/userstore.sock`.
public enum SocketDiscovery {
    /// The development socket's place in a checkout.
    public static let checkoutSocket = ".run/userstore.sock"

    /// The places to try, in order, without duplicates.
    public static func candidates(currentDirectory: String = FileManager.default.currentDirectoryPath,
                                  executable: String? = Self.executablePath()) -> [String] {
        var places: [String] = []
        for start in [currentDirectory, executable.map { ($0 as NSString).deletingLastPathComponent }].compactMap({ $0 }) {
            var directory = (start as NSString).standardizingPath
            while true {
                let candidate = directory + (directory.hasSuffix("/") ? "" : "/") + checkoutSocket
                if isSocket(candidate), !places.contains(candidate) { places.append(candidate) }
                let parent = (directory as NSString).deletingLastPathComponent
                if parent == directory || parent.isEmpty { break }
                directory = parent
            }
        }
        places.append(DaemonClient.defaultSocket)
        return places
    }

    /// Where a development daemon's socket was looked for, in words (for the error when none answers).
    public static func searched(currentDirectory: String = FileManager.default.currentDirectoryPath,
                                executable: String? = Self.executablePath()) -> String {
        var places = [currentDirectory]
        if let executable { places.append((executable as NSString).deletingLastPathComponent) }
        return "\(checkoutSocket) in " + places.joined(separator: " or ") + " or a folder above: none"
    }

    /// Whether `path` is a Unix socket.
    public static func isSocket(_ path: String) -> Bool {
        var status = stat()
        return stat(path, &status) == 0 && (status.st_mode & S_IFMT) == S_IFSOCK
    }

    /// This process's binary (`/proc/self/exe`).
    public static func executablePath() -> String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    }
}
