/// userstore's version: the one place it is written. `userstored --version`,
/// `userstorectl --version`, `Admin.Status`'s `daemonVersion`, `GetInfo` and the Debian
/// package's version (`make deb` reads it from this line) all come from here.
public enum UserStoreVersion {
    public static let current = "0.2.0"
}
