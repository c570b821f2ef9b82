import DaemonTestSupport
import Foundation
import Testing
import UserStoreJournal
import Varlink

/// Layer 1: the exact wire encoding, against a fake journal socket in a private mount namespace.
@Suite(.serialized) struct JournalWireTests {
    private func probe(_ mode: String) throws -> [[String: Any]] {
        let probe = productsDirectory + "/userstore-journal-probe"
        let result = try run(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                              "mount -t tmpfs tmpfs /run/systemd && exec \"$0\" \(mode)", probe])
        #expect(result.status == 0, "\(result.stderr)")
        return result.stdout.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    @Test func entriesAreEncodedExactly() throws {
        let output = try probe("wire")
        try #require(output.count == 3)
        let fields = (output[0]["fields"] as? [[String: String]] ?? []).map { ($0["name"]!, Data(base64Encoded: $0["base64"]!)!) }
        func value(_ name: String) -> String? { fields.first { $0.0 == name }.map { String(decoding: $0.1, as: UTF8.self) } }
        #expect(value("MESSAGE") == "migration 3 failed")
        #expect(value("PRIORITY") == "3")
        #expect(value("SYSLOG_IDENTIFIER") == "userstored")
        #expect(value("MESSAGE_ID") == JournalEvent.migrationFailed.messageID)
        #expect(value("CODE_FILE")?.hasSuffix("main.swift") == true)
        #expect(Int(value("CODE_LINE") ?? "") != nil)
        #expect(value("CODE_FUNC") != nil)
        #expect(value("USERSTORE_USER") == "alice")
        // A multi-line value, intact, sent in the binary-safe form.
        #expect(value("USERSTORE_SQLITE_MESSAGE") == "near \"FROM\": syntax error\nsecond line")
        #expect((output[0]["binarySafe"] as? [String]) == ["USERSTORE_SQLITE_MESSAGE"])
        // A name that needed sanitising; a value holding a NUL byte.
        #expect(value("USERSTORE_WEIRD_KEY_NAME_9") == "sanitised")
        #expect(fields.first { $0.0 == "USERSTORE_BINARY" }?.1 == Data([0x61, 0x00, 0x62]))
        #expect(fields.allSatisfy { name, _ in name.allSatisfy { $0.isUppercase || $0.isNumber || $0 == "_" } && !name.hasPrefix("_") })
        // An entry without an event has no MESSAGE_ID.
        let plain = (output[1]["fields"] as? [[String: String]] ?? []).map { $0["name"]! }
        #expect(!plain.contains("MESSAGE_ID") && plain.contains("USERSTORE_USER"))
        #expect((output[2]["counters"] as? [String: Int])?["failures"] == 0)
    }

    @Test func aFloodWithNoJournalReaderDoesNotStallTheCaller() throws {
        let output = try probe("flood")
        let result = try #require(output.first)
        // Every one of the 100,000 calls returned although nobody reads the socket; what the
        // bounded queue could not hold was dropped and counted.
        #expect(result["logged"] as? Int == 100_000)
        let dropped = try #require(result["dropped"] as? Int)
        let waiting = try #require(result["waiting"] as? Int)
        #expect(dropped > 0)
        #expect(waiting <= (result["capacity"] as? Int ?? 0))
        print("journal flood: 100,000 entries logged in \(result["elapsedMilliseconds"] ?? "?") ms, \(dropped) dropped")
    }

    @Test func fieldNamesAreSanitised() {
        #expect(JournalFields.name(for: "user") == "USERSTORE_USER")
        #expect(JournalFields.name(for: "from-version") == "USERSTORE_FROM_VERSION")
        #expect(JournalFields.name(for: "ünï cödé") == "USERSTORE__N__C_D_")
        #expect(JournalFields.name(for: String(repeating: "x", count: 100)).count == 64)
    }

    @Test func everyEventHasADistinctMessageIDAndACatalogEntry() throws {
        let catalog = try String(contentsOfFile: repositoryRoot + "/systemd/userstored.catalog", encoding: .utf8)
        let ids = JournalEvent.allCases.map(\.messageID)
        #expect(Set(ids).count == ids.count)
        for event in JournalEvent.allCases {
            #expect(event.messageID.count == 32 && event.messageID.allSatisfy(\.isHexDigit))
            #expect(catalog.contains("-- \(event.messageID)\n"), "\(event.rawValue) has no catalog entry")
        }
    }
}
