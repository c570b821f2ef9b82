import Foundation
import Testing
@testable import UserStoreCore

@Suite struct UserIDTests {
    @Test(arguments: ["a", "alice", "Bob_42", "x.y", "mail@example.com", "a+b", "9", "a-", "a..b",
                      String(repeating: "z", count: 128)])
    func acceptsValidIDs(_ id: String) throws {
        #expect(try UserID(id).rawValue == id)
    }

    @Test(arguments: ["", ".", "..", "a/b", "../x", "a\u{0}b", String(repeating: "z", count: 129), ".hidden", "-x",
                      "with space", "caf\u{e9}", "a\\b", "a\nb", "ユーザー", "a:b", "a*b"])
    func refusesInvalidIDs(_ id: String) {
        #expect(throws: UserIDError.self) { try UserID(id) }
    }

    @Test func errorsNameTheProblem() {
        #expect(throws: UserIDError.tooLong(129)) { try UserID(String(repeating: "a", count: 129)) }
        #expect(throws: UserIDError.empty) { try UserID("") }
        #expect(throws: UserIDError.forbiddenByte(UInt8(ascii: "/"), offset: 1)) { try UserID("a/b") }
        #expect(UserIDError.forbiddenByte(0, offset: 3).description.contains("0x0"))
    }

    @Test func pathIsAPureFunctionOfTheIDInsideTheDataDirectory() throws {
        let layout = StoreLayout(dataDirectory: "/srv/data/")
        let path = layout.storePath(for: try UserID("alice"))
        #expect(path == layout.storePath(for: try UserID("alice")))
        #expect(path.hasPrefix("/srv/data/stores/"))
        #expect(path.hasSuffix("/alice.sqlite"))
        let components = path.dropFirst("/srv/data/stores/".count).split(separator: "/")
        #expect(components.count == 3)
        #expect(components[0].count == 2 && components[1].count == 2)
        #expect(layout.storePath(for: try UserID("bob")) != path)
    }

    @Test func hashPrefixesSpreadUsers() throws {
        let prefixes = Set((0..<2000).map { StoreLayout.hashPrefix(of: try! UserID("user\($0)")) })
        #expect(prefixes.count > 1900)
    }
}

@Suite struct AppVersionTests {
    @Test func ordersVersionsNumerically() throws {
        #expect(try AppVersion("1.10") > AppVersion("1.9"))
        #expect(try AppVersion("1.2") == AppVersion("1.2.0"))
        #expect(try AppVersion("2.0-beta.1") < AppVersion("2.0"))
        #expect(try AppVersion("2.0-beta.2") < AppVersion("2.0-beta.10"))
        #expect(try AppVersion("2.0+build.7") == AppVersion("2.0"))
        #expect(try AppVersion("10.0") > AppVersion("9.99.99"))
        #expect(try AppVersion("2026.11.2") > AppVersion("2026.9.30"))
        #expect(try AppVersion("1.0.0.1") > AppVersion("1.0"))
    }

    @Test(arguments: ["", "1..2", ".1", "1.", "1.0 beta", "v1/2", "1.0-"])
    func refusesMalformed(_ text: String) {
        #expect(throws: AppVersionError.self) { try AppVersion(text) }
    }
}
