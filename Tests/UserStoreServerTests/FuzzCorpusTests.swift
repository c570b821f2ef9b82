import Foundation
import Testing
@testable import UserStoreCore
@testable import UserStoreServer
@testable import Varlink
import UserStoreFuzzTargets

/// Replays every file of the fuzzers' seed corpora (`Fuzz/corpus/<target>/`) through the very
/// functions the libFuzzer targets call, so that a seed that once found a bug stays a regression
/// test in every `swift test`, without libFuzzer. A broken invariant traps, failing the run.
@Suite struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/corpus")

    @Test(arguments: ["json", "framing", "call", "migration", "sql"])
    func seedCorpusReplays(target: String) throws {
        // The example's migrations are seeds of the migration target too (scripts/fuzz.sh passes them).
        var directories = [Self.corpus.appendingPathComponent(target)]
        if target == "migration" { directories.append(Self.corpus.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("config/migrations")) }
        let files = try directories.flatMap { directory in
            try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted().map { directory.appendingPathComponent($0) }
        }
        // Every target has seeds; an empty directory would make this test vacuous.
        #expect(files.count >= 5, "Fuzz/corpus/\(target) has \(files.count) seeds")
        let body = try #require(ServerFuzzing.targets[target])
        for file in files {
            let bytes = try [UInt8](Data(contentsOf: file))
            bytes.withUnsafeBufferPointer { body($0) }
        }
    }

    /// The framer the framing target checks: a message over its limit is refused, messages
    /// within it are cut at their NUL.
    @Test func framerCutsMessagesAndRefusesLongOnes() {
        var framer = MessageFramer(maxMessageBytes: 4)
        let long: [UInt8] = Array("abcdefgh".utf8) + [0]
        let result = long.withUnsafeBytes { framer.next(in: $0) }
        guard case .tooLarge = result else { Issue.record("expected tooLarge, got \(result)"); return }
        var framer2 = MessageFramer(maxMessageBytes: 64)
        let two: [UInt8] = Array("ab".utf8) + [0] + Array("c".utf8) + [0]
        let first = two.withUnsafeBytes { framer2.next(in: $0) }
        guard case .message(let length) = first else { Issue.record("expected a message, got \(first)"); return }
        #expect(length == 2)
    }
}
