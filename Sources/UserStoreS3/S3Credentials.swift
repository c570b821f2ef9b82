import Foundation

/// An access key pair for S3 (and the session token of temporary credentials).
public struct S3Credentials: Sendable, Equatable {
    public var accessKeyID: String
    public var secretAccessKey: String
    public var sessionToken: String?

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }

    /// A credentials file that could not be used.
    public struct Problem: Error, CustomStringConvertible {
        public let description: String
    }

    /// Reads `path`: the AWS shared-credentials format (`[profile]` sections of
    /// `aws_access_key_id = …`, `aws_secret_access_key = …`, optionally `aws_session_token = …`),
    /// or the same keys as `NAME=value` lines without a section (an environment file, a systemd
    /// credential). Key names are matched without regard to case.
    public static func load(file path: String, profile: String = "default") throws(Problem) -> S3Credentials {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw Problem(description: "cannot read the S3 credentials file \(path)")
        }
        var section: String?
        var values: [String: String] = [:]
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                section = String(line.dropFirst().dropLast()).trimmingCharacters(in: .whitespaces)
                continue
            }
            guard section == nil || section == profile || section == "profile \(profile)",
                  let equals = line.firstIndex(of: "=") else { continue }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces).lowercased()
            values[key] = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                .trimmingCharacters(in: CharacterSet(charactersIn: "\"'"))
        }
        guard let id = values["aws_access_key_id"], !id.isEmpty, let secret = values["aws_secret_access_key"], !secret.isEmpty else {
            throw Problem(description: "the S3 credentials file \(path) has no aws_access_key_id and aws_secret_access_key\(section == nil ? "" : " for profile \(profile)")")
        }
        return S3Credentials(accessKeyID: id, secretAccessKey: secret, sessionToken: values["aws_session_token"].flatMap { $0.isEmpty ? nil : $0 })
    }

    /// From the environment, as Litestream reads it: `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (else `LITESTREAM_ACCESS_KEY_ID` and `LITESTREAM_SECRET_ACCESS_KEY`),
    /// and `AWS_SESSION_TOKEN`; nil when a key is missing.
    public static func fromEnvironment(_ environment: [String: String]) -> S3Credentials? {
        guard let id = environment["AWS_ACCESS_KEY_ID"] ?? environment["LITESTREAM_ACCESS_KEY_ID"], !id.isEmpty,
              let secret = environment["AWS_SECRET_ACCESS_KEY"] ?? environment["LITESTREAM_SECRET_ACCESS_KEY"], !secret.isEmpty else { return nil }
        return S3Credentials(accessKeyID: id, secretAccessKey: secret, sessionToken: environment["AWS_SESSION_TOKEN"])
    }

    /// The environment variables that hand these credentials to Litestream.
    public var environment: [String: String] {
        var variables = ["AWS_ACCESS_KEY_ID": accessKeyID, "AWS_SECRET_ACCESS_KEY": secretAccessKey]
        if let sessionToken { variables["AWS_SESSION_TOKEN"] = sessionToken }
        return variables
    }
}
